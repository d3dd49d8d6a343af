"""What prime-rl needs at run time beyond its config classes (issue 39): the install the config renders, the attention
kernel on a machine without flash-attn wheels, and inference and trainer sharing one GPU.

* The locked install (prime-rl's uv.lock at the pin, with the configured extras) holds every package and program
  the rendered run imports or starts: the flash-attn wheel (prime-rl's trainer imports ring-flash-attn, which
  imports it, whatever ``attn`` says) and no ``vllm-router`` program (only the ``disagg`` extra installs it), so
  the rendered inference runs a bare engine (``router = "None"``).
* ``prime_rl.attn: flash_attention_2_torch``: prime-rl's FA2 path with PyTorch's FA2 kernels
  (`predict.train.prime_rl.attention`), through ``workflow/prime-rl/torch-attention.patch``.
* ``prime_rl.rl.colocate``: prime-rl's launcher gets each GPU twice, weights go through the filesystem, the vLLM
  server leaves the trainer room.

The lock and patch checks need the pinned source (PREDICT_PRIME_RL_SRC, as tests/test_prime_rl_patch.py).
"""

from __future__ import annotations

import ast
import re
import subprocess
import tomllib
from pathlib import Path
from typing import Any

import pytest
import torch

from predict.config import REPO_ROOT, load_config
from predict.stages import stage_settings
from predict.train.prime_rl import attention, cluster, configs
from predict.train.prime_rl.configs import PrimeRLConfigError
from tests.test_prime_rl_patch import _source

ATTENTION_PATCH = REPO_ROOT / "workflow" / "prime-rl" / configs.TORCH_FA2_PATCH
TRAINER_MODULES = ("src/prime_rl/trainer/rl/train.py", "src/prime_rl/trainer/sft/train.py", "src/prime_rl/utils/cp.py")
ATTN_MODULE = "src/prime_rl/trainer/models/layers/attn.py"


@pytest.fixture(scope="module")
def paper() -> dict[str, Any]:
    return load_config(REPO_ROOT / "config" / "config.yaml")


def with_prime_rl(cfg: dict[str, Any], **changes: Any) -> dict[str, Any]:
    rl = changes.pop("rl", {})
    return {**cfg, "prime_rl": {**cfg["prime_rl"], **changes, "rl": {**cfg["prime_rl"]["rl"], **rl}}}


def render(cfg: dict[str, Any], tmp_path: Path, run: str = "B") -> dict[str, Any]:
    return configs.rl_config(cfg, run, 42, model=tmp_path / "sft", tasks=tmp_path / "rl.parquet", output_dir=tmp_path)


# ---------------------------------------------------------------------------------------------------------------
# The locked install against what the rendered run needs
# ---------------------------------------------------------------------------------------------------------------
def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def locked_install(lock_path: Path, extras: list[str]) -> set[str]:
    """The packages ``uv sync --locked --extra ...`` installs for prime-rl on linux x86_64 (marker-light: every
    dependency edge of the lock is followed, except extras nobody asked for)."""
    lock = tomllib.loads(lock_path.read_text())
    packages = {_norm(p["name"]): p for p in lock["package"]}
    seen: set[str] = set()
    todo: list[tuple[str, tuple[str, ...]]] = [("prime-rl", tuple(extras))]
    while todo:
        name, wanted = todo.pop()
        package = packages.get(_norm(name))
        if package is None:
            continue
        edges = [] if _norm(name) in seen else list(package.get("dependencies", []))
        seen.add(_norm(name))
        for extra in wanted:
            edges += package.get("optional-dependencies", {}).get(extra, [])
        for edge in edges:
            if "aarch64" in str(edge.get("marker", "")) and "x86_64" not in str(edge.get("marker", "")):
                continue
            todo.append((edge["name"], tuple(edge.get("extra", ()))))
    return seen


def test_the_locked_install_has_what_the_rendered_run_needs(paper: dict[str, Any], tmp_path: Path) -> None:
    src = _source(tmp_path)
    lock = src / "uv.lock"
    if not lock.exists():
        pytest.skip(f"{src} has no uv.lock (a partial export)")
    installed = locked_install(lock, paper["prime_rl"]["extras"])
    # sanity of the reading: the base install has the trainer's ring-flash-attn and no router, disagg has the router
    assert {"torch", "vllm", "ring-flash-attn"} <= installed and "vllm-router" not in installed
    assert "vllm-router" in locked_install(lock, ["disagg"])
    # ring-flash-attn imports the flash-attn wheel's FA2 interface at module level; prime-rl's trainer imports it
    ring = (src / "src/prime_rl/trainer/rl/train.py").read_text()
    assert re.search(r"^from ring_flash_attn import", ring, flags=re.M)
    assert "flash-attn" in installed, f"prime_rl.extras {paper['prime_rl']['extras']}: no flash-attn wheel"
    # prime-rl's default inference router is the vllm-router program, which this install lacks: a bare engine
    t = render(paper, tmp_path)
    assert t["inference"]["router"] == "None"


# ---------------------------------------------------------------------------------------------------------------
# flash_attention_2_torch: rendering, extras, setup's patches
# ---------------------------------------------------------------------------------------------------------------
def test_every_flash_kernel_needs_the_flash_attn_extra(paper: dict[str, Any], tmp_path: Path) -> None:
    for attn, extra in configs.ATTN_EXTRAS.items():
        ok = with_prime_rl(paper, attn=attn, extras=sorted({extra, "flash-attn"}))
        assert render(ok, tmp_path)["trainer"]["model"]["attn"] == attn
        assert configs.attention_patches(ok) == []
    fa3_only = with_prime_rl(paper, attn="flash_attention_3", extras=["flash-attn-3"])
    with pytest.raises(PrimeRLConfigError, match=r"prime_rl.extras: \['flash-attn-3'\] lacks 'flash-attn'.*ring-flash"):
        render(fa3_only, tmp_path)


def test_torch_fa2_renders_prime_rls_fa2_and_asks_for_the_patch(paper: dict[str, Any], tmp_path: Path) -> None:
    cfg = with_prime_rl(paper, attn="flash_attention_2_torch", extras=[])
    assert render(cfg, tmp_path)["trainer"]["model"]["attn"] == "flash_attention_2"
    sft = configs.sft_config(cfg, "B", model="m/m", dataset_dir=tmp_path / "d", output_dir=tmp_path / "o")
    assert sft["model"]["attn"] == "flash_attention_2"
    assert configs.attention_patches(cfg) == [configs.TORCH_FA2_PATCH] and ATTENTION_PATCH.exists()
    with pytest.raises(PrimeRLConfigError, match=r"holds 'flash-attn'.*instead of PyTorch's kernel"):
        render(with_prime_rl(paper, attn="flash_attention_2_torch", extras=["flash-attn"]), tmp_path)
    # the schema accepts the value (load_config validates)
    assert "flash_attention_2_torch" in (REPO_ROOT / "config" / "schema.yaml").read_text()


def test_setup_applies_the_attention_patch_only_where_asked(paper: dict[str, Any], tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """`predict prime-rl-setup`: the algorithm patch always, then the kernel's patches; uv and git are recorded."""
    applied: list[str] = []
    monkeypatch.setattr(cluster, "check_uv", lambda uv="uv": (0, 11, 1))
    monkeypatch.setattr(cluster, "checkout", lambda *a, **k: None)
    monkeypatch.setattr(cluster, "apply_patch", lambda dest, patch=cluster.PATCH: applied.append(Path(patch).name))
    monkeypatch.setattr(cluster, "_run", lambda argv, cwd=None, env=None: None)
    for attn, extras, expected in [
        ("flash_attention_3", ["flash-attn", "flash-attn-3"], ["predict-algorithm.patch"]),
        ("flash_attention_2_torch", [], ["predict-algorithm.patch", "torch-attention.patch"]),
    ]:
        applied.clear()
        cfg = with_prime_rl(paper, attn=attn, extras=extras)
        args = type("Args", (), {"dir": str(tmp_path / "prl"), "patch": None, "patches_dir": None,
                                 "out": str(tmp_path / "setup.json")})()
        cluster.setup_main(args, stage_settings("prime-rl-setup", cfg))  # as the CLI hands it
        assert applied == expected


def test_the_attention_patch_applies_and_defers_ring_flash_attn(tmp_path: Path) -> None:
    src = _source(tmp_path)
    work = tmp_path / "work"
    subprocess.run(["cp", "-r", str(src), str(work)], check=True)
    for patch in (cluster.PATCH, ATTENTION_PATCH):
        check = subprocess.run(["git", "apply", "--check", str(patch)], cwd=work, capture_output=True, text=True)
        assert check.returncode == 0, check.stderr
        subprocess.run(["git", "apply", str(patch)], cwd=work, check=True)
    for path in TRAINER_MODULES:
        tree = ast.parse((work / path).read_text())
        top = [n for n in tree.body if isinstance(n, ast.ImportFrom) and (n.module or "").startswith("ring_flash_attn")]
        assert not top, f"{path}: ring_flash_attn still imported when the trainer starts"
        nested = [n for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module == "ring_flash_attn"]
        assert nested, f"{path}: ring_flash_attn no longer imported where CP uses it"
    attn = (work / ATTN_MODULE).read_text()
    assert "from predict.train.prime_rl.attention import flash_attn_varlen_func" in attn
    assert attn.index("from flash_attn import flash_attn_varlen_func") < attn.index("predict.train.prime_rl.attention")


# ---------------------------------------------------------------------------------------------------------------
# The kernel: flash-attn's varlen contract on PyTorch (CPU: the reference path)
# ---------------------------------------------------------------------------------------------------------------
def naive_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, lengths: list[int], window: int) -> torch.Tensor:
    """Causal (optionally sliding-window) attention, one sequence and one head at a time, written out."""
    heads, groups = q.shape[1], q.shape[1] // k.shape[1]
    out = torch.zeros_like(q)
    start = 0
    for n in lengths:
        for h in range(heads):
            qs, ks, vs = q[start:start + n, h], k[start:start + n, h // groups], v[start:start + n, h // groups]
            scores = qs @ ks.T / q.shape[-1] ** 0.5
            i, j = torch.arange(n)[:, None], torch.arange(n)[None, :]
            allowed = (j <= i) & ((j >= i - window) if window >= 0 else True)
            out[start:start + n, h] = torch.softmax(scores.masked_fill(~allowed, float("-inf")), -1) @ vs
        start += n
    return out


@pytest.mark.parametrize("window", [-1, 3])
def test_torch_fa2_is_flash_attns_varlen_contract(window: int) -> None:
    torch.manual_seed(0)
    lengths, heads, kv_heads, dim = [5, 1, 9], 4, 2, 8
    total = sum(lengths)
    q, k, v = (torch.randn(total, h, dim, dtype=torch.float64, requires_grad=True) for h in (heads, kv_heads, kv_heads))
    cu = torch.tensor([0, 5, 6, 15], dtype=torch.int32)
    kwargs = {"causal": True} if window < 0 else {"causal": True, "window_size": (window, 0)}
    out = attention.flash_attn_varlen_func(q, k, v, cu, cu, max(lengths), max(lengths), **kwargs)
    expected = naive_attention(q, k, v, lengths, window)
    assert out.shape == (total, heads, dim)
    assert torch.allclose(out, expected, atol=1e-10)
    grads = torch.autograd.grad(out.square().sum(), (q, k, v))
    expected_grads = torch.autograd.grad(expected.square().sum(), (q, k, v))
    for got, want in zip(grads, expected_grads, strict=True):
        assert torch.allclose(got, want, atol=1e-10)
    # documents never see each other: changing the first sequence leaves the others' outputs alone
    q2 = q.detach().clone()
    q2[:5] += 1.0
    again = attention.flash_attn_varlen_func(q2, k, v, cu, cu, 9, 9, **kwargs)
    assert torch.equal(again[5:], out.detach()[5:]) and not torch.allclose(again[:5], out.detach()[:5])


def test_torch_fa2_refuses_what_it_does_not_do() -> None:
    q = torch.zeros(4, 2, 8)
    cu = torch.tensor([0, 4], dtype=torch.int32)
    with pytest.raises(ValueError, match="dropout"):
        attention.flash_attn_varlen_func(q, q, q, cu, cu, 4, 4, dropout_p=0.1)
    with pytest.raises(ValueError, match="softcap"):
        attention.flash_attn_varlen_func(q, q, q, cu, cu, 4, 4, softcap=30.0)
    with pytest.raises(ValueError, match="not a multiple"):
        attention.flash_attn_varlen_func(torch.zeros(4, 3, 8), q, q, cu, cu, 4, 4)


# ---------------------------------------------------------------------------------------------------------------
# Colocated: inference and trainer on the same GPUs
# ---------------------------------------------------------------------------------------------------------------
def test_a_colocated_run_shares_each_gpu(paper: dict[str, Any], tmp_path: Path) -> None:
    cfg = with_prime_rl(paper, rl={"colocate": True, "gpu_memory_utilization": 0.3})
    t = render(cfg, tmp_path)
    assert t["deployment"] == {"type": "single_node", "num_train_gpus": 1, "num_infer_gpus": 1}
    assert t["inference"]["gpu_memory_utilization"] == 0.3 and t["weight_broadcast"] == {"type": "filesystem"}
    assert t["env_vars"][configs.COLOCATE_VAR] == "1"
    # prime-rl's launcher maps inference to local id 0 and the trainer to local id 1: both the job's GPU
    env = cluster.launch_env("rl", t, {"CUDA_VISIBLE_DEVICES": "3"})
    assert env["CUDA_VISIBLE_DEVICES"] == "3,3"
    assert cluster.launch_env("rl", t, {})["CUDA_VISIBLE_DEVICES"] == "0,0"
    assert "CUDA_VISIBLE_DEVICES" not in cluster.launch_env("sft", t, {})
    # not colocated: prime-rl's defaults (NCCL weights, its memory share), the job's GPUs as they are
    plain = render(paper, tmp_path)
    assert "weight_broadcast" not in plain and "gpu_memory_utilization" not in plain["inference"]
    assert configs.COLOCATE_VAR not in plain["env_vars"]
    assert cluster.launch_env("rl", plain, {"CUDA_VISIBLE_DEVICES": "0,1"})["CUDA_VISIBLE_DEVICES"] == "0,1"
    for rl, says in [({"colocate": True}, "gpu_memory_utilization: None"),
                     ({"colocate": True, "gpu_memory_utilization": 0.9}, "at most 0.6"),
                     ({"colocate": True, "gpu_memory_utilization": 0.3, "train_gpus": 2}, "must equal infer_gpus")]:
        with pytest.raises(PrimeRLConfigError, match=says):
            render(with_prime_rl(paper, rl=rl), tmp_path)
    with pytest.raises(PrimeRLConfigError, match="shows 1 GPUs, 2 needed"):
        configs.colocated_devices("0", 2)
