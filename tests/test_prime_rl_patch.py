"""The registration patch (workflow/prime-rl/predict-algorithm.patch) against prime-rl at the pinned commit.

The apply test needs the pinned source: set PREDICT_PRIME_RL_SRC to a prime-rl checkout at the pinned commit, or
to a git repository (bare or not) that has the commit (its files are exported with `git archive`). Without it the
test is skipped with that reason; the checks on the patch text itself always run.
"""

from __future__ import annotations

import ast
import os
import py_compile
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest

from predict.config import REPO_ROOT, load_config
from predict.runs import study_runs
from predict.train.prime_rl.cluster import PATCH

PINNED = load_config(REPO_ROOT / "config" / "config.yaml")["prime_rl"]["commit"]
CONFIGS = "packages/prime-rl-configs/src/prime_rl/configs/algorithm.py"
REGISTRY = "src/prime_rl/orchestrator/algo/__init__.py"
SHIM = "src/prime_rl/orchestrator/algo/predict.py"


REQUIRE = "PREDICT_REQUIRE_PRIME_RL"
"""Set (by .ci/run, when ../shared holds the pinned sources) to make these skips failures: CI runs them all."""


def skip_unless_required(reason: str) -> None:
    """Skip with `reason`, or fail with it where the prime-rl tests are required (``PREDICT_REQUIRE_PRIME_RL=1``)."""
    if os.environ.get(REQUIRE):
        pytest.fail(f"{REQUIRE} is set but: {reason}")
    pytest.skip(reason)


def patched_files(text: str) -> list[str]:
    return re.findall(r"^diff --git a/(\S+) b/", text, flags=re.M)


def added_lines(text: str, path: str) -> list[str]:
    block = text.split(f"diff --git a/{path} b/{path}", 1)[1].split("\ndiff --git ", 1)[0]
    return [line[1:] for line in block.splitlines() if line.startswith("+") and not line.startswith("+++")]


def test_the_patch_is_small_and_names_the_pinned_commit() -> None:
    text = PATCH.read_text()
    assert PINNED in text.split("diff --git", 1)[0]
    assert sorted(patched_files(text)) == sorted([CONFIGS, REGISTRY, SHIM])
    assert not re.search(r"^-(?!--)", text, flags=re.M), "the patch only adds lines"
    assert added_lines(text, REGISTRY) == [
        "from prime_rl.orchestrator.algo.predict import GRPOStdAlgorithm, PredictAlgorithm",
        '    "grpo_std": GRPOStdAlgorithm,',
        '    "predict": PredictAlgorithm,',
    ]
    assert "from predict.train.prime_rl.algorithm import GRPOStdAlgorithm, PredictAlgorithm" in added_lines(text, SHIM)


def test_the_config_class_declares_what_we_render() -> None:
    """PredictAlgoConfig (from the patch) = GRPOAlgoConfig + the keys configs.rl_config writes for Arm B."""
    lines = added_lines(PATCH.read_text(), CONFIGS)
    start = next(i for i, line in enumerate(lines) if line.startswith("class PredictAlgoConfig"))
    end = next(i for i in range(start + 1, len(lines)) if lines[i].startswith("    |"))  # the union member
    (cls,) = ast.parse("\n".join(lines[start:end])).body
    assert isinstance(cls, ast.ClassDef) and [b.id for b in cls.bases] == ["GRPOAlgoConfig"]
    fields = [s.target.id for s in cls.body if isinstance(s, ast.AnnAssign)]
    assert fields == ["type", "alpha", "mask_decision", "tokenizer"]
    assert "    | PredictAlgoConfig" in lines  # the discriminated union member
    # Arm A's config: GRPO's fields, its own type (the std-normalised advantage of GRPOStdAlgorithm)
    start = next(i for i, line in enumerate(lines) if line.startswith("class GRPOStdAlgoConfig"))
    end = next(i for i in range(start + 1, len(lines)) if lines[i].startswith("class "))
    (cls,) = ast.parse("\n".join(lines[start:end])).body
    assert isinstance(cls, ast.ClassDef) and [b.id for b in cls.bases] == ["GRPOAlgoConfig"]
    assert [s.target.id for s in cls.body if isinstance(s, ast.AnnAssign)] == ["type"]
    assert "    | GRPOStdAlgoConfig" in lines


def _source(tmp_path: Path) -> Path:
    src = os.environ.get("PREDICT_PRIME_RL_SRC")
    if not src:
        skip_unless_required(
            "PREDICT_PRIME_RL_SRC is not set: point it at a prime-rl checkout (or git repository) at "
            f"{PINNED} to check that the patch applies"
        )
    src_path = Path(src)
    if (src_path / CONFIGS).exists():
        return src_path
    # a git repository with the commit: export the files the patch touches (and their context) at the pin
    git = ["git", f"--git-dir={src_path / '.git' if (src_path / '.git').exists() else src_path}"]
    if subprocess.run([*git, "cat-file", "-e", f"{PINNED}^{{commit}}"], capture_output=True).returncode != 0:
        pytest.fail(f"PREDICT_PRIME_RL_SRC={src} has no commit {PINNED}")
    out = tmp_path / "prime-rl"
    out.mkdir()
    archive = subprocess.run(
        [*git, "archive", PINNED, "src/prime_rl", "packages/prime-rl-configs"],
        capture_output=True,
        check=True,
    ).stdout
    subprocess.run(["tar", "-x", "-C", out], input=archive, check=True)
    return out


def test_the_patch_applies_cleanly_to_the_pinned_source(tmp_path: Path) -> None:
    src = _source(tmp_path)
    work = tmp_path / "work"
    subprocess.run(["cp", "-r", str(src), str(work)], check=True)
    check = subprocess.run(["git", "apply", "--check", "-v", str(PATCH)], cwd=work, capture_output=True, text=True)
    assert check.returncode == 0, check.stderr
    subprocess.run(["git", "apply", str(PATCH)], cwd=work, check=True)
    for path in (CONFIGS, REGISTRY, SHIM):
        py_compile.compile(str(work / path), doraise=True)
    registry = ast.parse((work / REGISTRY).read_text())
    classes = next(
        n.value
        for n in registry.body
        if isinstance(n, ast.AnnAssign) and getattr(n.target, "id", "") == "ALGORITHM_CLASSES"
    )
    entries = {k.value: v.id for k, v in zip(classes.keys, classes.values, strict=True)}
    assert entries["predict"] == "PredictAlgorithm" and entries["grpo"] == "GRPOAlgorithm"
    assert entries["grpo_std"] == "GRPOStdAlgorithm"
    # applying twice fails loudly (the setup stage resets the checkout before applying)
    again = subprocess.run(["git", "apply", "--check", str(PATCH)], cwd=work, capture_output=True)
    assert again.returncode != 0


def test_rendered_algo_tables_validate_against_the_patched_config_union(tmp_path: Path) -> None:
    """The ``[orchestrator.algo]`` tables we render for Arm A and Arm B parse with prime-rl's own AlgoConfig union
    (the patched ``prime_rl.configs.algorithm``, imported in a child process next to this venv's verifiers)."""

    from predict.train.prime_rl import configs

    work = patched_source(tmp_path)
    cfg = load_config(REPO_ROOT / "config" / "config.yaml")
    tables = {
        run: configs.rl_config(cfg, run, 42, model="m/m", tasks="rl.parquet", output_dir="out")["orchestrator"]["algo"]
        for run in study_runs(cfg)
    }
    code = (
        "import json, sys; from pydantic import TypeAdapter; from prime_rl.configs.algorithm import AlgoConfig\n"
        "tables = json.loads(sys.argv[1])\n"
        "print(json.dumps({run: TypeAdapter(AlgoConfig).validate_python(t).model_dump(mode='json') "
        "for run, t in tables.items()}))"
    )
    parsed = _run_with_prime_rl_configs(code, tables, [work / "packages" / "prime-rl-configs" / "src"], timeout=300)
    assert parsed["A"]["type"] == "grpo_std"
    assert parsed["B"]["type"] == "predict" and parsed["B"]["alpha"] == cfg["arms"]["B"]["alpha"]
    assert parsed["alpha0"]["alpha"] == 0.0


def _verifiers_source(tmp_path: Path, prime_rl_src: Path) -> Path:
    """verifiers at prime-rl's submodule pin: the checkout's deps/verifiers, or PREDICT_VERIFIERS_SRC (a checkout
    or a git repository with that commit)."""
    if (prime_rl_src / "deps" / "verifiers" / "verifiers" / "v1").is_dir():
        return prime_rl_src / "deps" / "verifiers"
    src = os.environ.get("PREDICT_VERIFIERS_SRC")
    if not src:
        skip_unless_required("the full config check needs verifiers at prime-rl's pin: set PREDICT_VERIFIERS_SRC")
    src_path = Path(src)
    if (src_path / "verifiers" / "v1").is_dir():
        return src_path
    prime_git = os.environ["PREDICT_PRIME_RL_SRC"]
    pin = subprocess.run(
        ["git", f"--git-dir={prime_git}", "ls-tree", PINNED, "deps/verifiers"], capture_output=True, text=True
    ).stdout.split()[2]
    out = tmp_path / "verifiers"
    out.mkdir()
    git_dir = src_path / ".git" if (src_path / ".git").exists() else src_path
    archive = subprocess.run(
        ["git", f"--git-dir={git_dir}", "archive", pin, "verifiers"], capture_output=True, check=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", out], input=archive, check=True)
    return out


def patched_source(tmp_path: Path) -> Path:
    """The pinned prime-rl tree copied to ``tmp_path/patched`` with the registration patch applied."""
    work = tmp_path / "patched"
    subprocess.run(["cp", "-r", str(_source(tmp_path)), str(work)], check=True)
    subprocess.run(["git", "apply", str(PATCH)], cwd=work, check=True)
    return work


def _run_with_prime_rl_configs(code: str, payload: Any, path: list[Path], *, timeout: int) -> Any:
    """`code` in a child of this venv with `path` first on PYTHONPATH and `payload` as JSON in ``sys.argv[1]``; its
    stdout as JSON. Skipped (a failure under PREDICT_REQUIRE_PRIME_RL) when prime-rl's configs need a module this venv
    lacks."""
    import json
    import sys

    env = {**os.environ, "PYTHONPATH": os.pathsep.join(map(str, path))}
    result = subprocess.run(
        [sys.executable, "-c", code, json.dumps(payload)], capture_output=True, text=True, env=env, timeout=timeout
    )
    if result.returncode != 0 and "ModuleNotFoundError" in result.stderr:
        skip_unless_required(f"prime-rl's configs need a module this venv lacks: {result.stderr.strip()[-200:]}")
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout)


VALIDATE_CODE = (
    "from prime_rl.configs.rl import RLConfig\nfrom prime_rl.configs.sft import SFTConfig\n"
    "out = {}\n"
    "for name, t in payload['validate'].items():\n"
    "    c = (RLConfig if name.startswith('rl/') else SFTConfig).model_validate(t)\n"
    "    w = [c.trainer.wandb, c.orchestrator.wandb] if name.startswith('rl/') else [c.wandb]\n"
    "    out[name + '/wandb'] = [None if x is None else [x.project, x.name, x.offline] for x in w]\n"
    "    if name.startswith('rl/'):\n"
    "        src = c.orchestrator.train.source[0]\n"
    "        env = src.env\n"
    "        out[name] = [type(c.orchestrator.algo).__name__, type(env.taskset).__name__,\n"
    "                     type(env.agent.harness).__name__, (lambda p: p['variant'] if isinstance(p, dict) else p.variant)(env.agent.harness.protocol),\n"
    "                     str(c.trainer.output_dir), c.trainer.ckpt.weights is not None,\n"
    "                     src.group_size, src.algo.type]\n"
    "        out[name + '/design'] = [c.trainer.loss.type, c.trainer.loss.import_path, c.trainer.loss.kwargs,\n"
    "            c.trainer.ckpt.resume_step, c.orchestrator.ckpt.resume_step, c.trainer.model.attn,\n"
    "            c.trainer.model.optimization_dtype, [[f.type, f.enforce] for f in c.orchestrator.post_batch_filters],\n"
    "            env.taskset.order_seed, str(c.trainer.model.name)]\n"
    "        out[name + '/serving'] = [c.inference.router, c.inference.gpu_memory_utilization,\n"
    "            c.weight_broadcast.type, c.orchestrator.weight_broadcast.type, c.trainer.weight_broadcast.type,\n"
    "            c.trainer.model.attn, c.orchestrator.model.client.base_url, c.inference.server.port]\n"
    "    else:\n"
    "        out[name] = [c.data.name, c.renderer.name, c.ckpt.resume_step, c.model.attn]\n"
    "results['validate'] = out\n"
)

REWRITE_CODE = (
    "import tomllib, tomli_w\n"
    "from prime_rl.configs.rl import RLConfig\nfrom prime_rl.configs.orchestrator import OrchestratorConfig\n"
    "from prime_rl.utils.config import to_toml_dict\n"
    "out = {}\n"
    "for name, t in payload['rewrite'].items():\n"
    "    c = RLConfig.model_validate(t)\n"
    "    text = tomli_w.dumps(to_toml_dict(c.orchestrator))  # the launcher's write_subconfigs\n"
    "    again = OrchestratorConfig.model_validate(tomllib.loads(text))\n"
    "    dump = lambda o: o.train.source[0].env.model_dump(mode='json')\n"
    "    out[name] = [dump(again) == dump(c.orchestrator), dump(again)['agent']['harness']['protocol']]\n"
    "results['rewrite'] = out\n"
)


@pytest.fixture(scope="module")
def rendered(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any], dict[str, Any]]:
    """The rendered TOMLs of the two checks below, parsed by prime-rl's configs at the pin in one child (its imports
    of prime-rl's configs and verifiers at the pin are ~3 s each time on the 2-core machines): (the folder the
    tables point into, VALIDATE_CODE's output, REWRITE_CODE's output)."""
    from predict.train.prime_rl import configs

    tmp_path = tmp_path_factory.mktemp("rendered")
    work = patched_source(tmp_path)
    vf_src = _verifiers_source(tmp_path, work)
    cfg = load_config(REPO_ROOT / "config" / "config.yaml")
    validate = {
        f"rl/{run}": configs.rl_config(
            cfg, run, 42, model=tmp_path / "sft", tasks=tmp_path / "rl.parquet", output_dir=tmp_path / "out"
        )
        for run in study_runs(cfg)
    }
    validate["sft/B"] = configs.sft_config(
        cfg, "B", model=cfg["model"]["base"], dataset_dir=tmp_path / "data", output_dir=tmp_path / "sft-out"
    )
    # issue 39: one GPU shared by inference and trainer, prime-rl's FA2 path on PyTorch's kernel
    colocated = {**cfg, "prime_rl": {**cfg["prime_rl"], "attn": "flash_attention_2_torch", "extras": [],
                                     "rl": {**cfg["prime_rl"]["rl"], "colocate": True, "gpu_memory_utilization": 0.3}}}
    validate["rl/B/colocated"] = configs.rl_config(colocated, "B", 42, model=tmp_path / "sft",
                                                   tasks=tmp_path / "rl.parquet", output_dir=tmp_path / "out")
    for mode in ("online", "offline"):  # issue 29: the W&B monitors the renderer emits for tracking.wandb.mode
        tracked = {**cfg, "tracking": {"tensorboard": True, "wandb": {"mode": mode, "project": "predict"}}}
        validate[f"rl/B/wandb-{mode}"] = configs.rl_config(tracked, "B", 42, model=tmp_path / "sft",
                                                           tasks=tmp_path / "rl.parquet", output_dir=tmp_path / "out")
        validate[f"sft/B/wandb-{mode}"] = configs.sft_config(tracked, "B", model=cfg["model"]["base"],
                                                             dataset_dir=tmp_path / "data", output_dir=tmp_path / "s")
    rewrite = {run: configs.rl_config(cfg, run, 42, model=tmp_path / "sft", tasks=tmp_path / "rl.parquet",
                                       output_dir=tmp_path / "out") for run in study_runs(cfg)}
    code = "import json, sys\npayload = json.loads(sys.argv[1])\nresults = {}\n" + VALIDATE_CODE + REWRITE_CODE
    # this checkout's predict first (the venv may hold another editable install of it)
    parsed = _run_with_prime_rl_configs(
        code + "print(json.dumps(results))\n",
        {"validate": validate, "rewrite": rewrite},
        [REPO_ROOT / "src", vf_src, work / "packages" / "prime-rl-configs" / "src"],
        timeout=600,
    )
    return tmp_path, parsed["validate"], parsed["rewrite"]


def test_rendered_tomls_validate_as_prime_rl_rl_and_sft_configs(
    rendered: tuple[Path, dict[str, Any], dict[str, Any]],
) -> None:
    """The whole rendered ``rl`` (every run) and ``sft`` TOMLs parse with prime-rl's RLConfig / SFTConfig at the pin
    (extra keys forbidden), with verifiers at prime-rl's pin resolving our taskset and harness configs by id."""

    tmp_path, parsed, _ = rendered
    cfg = load_config(REPO_ROOT / "config" / "config.yaml")
    # W&B only when asked; asked for, both processes of an RL run and SFT log to the project, offline as asked (the
    # rl entrypoint's shared [wandb] refuses offline: the renderer puts an offline monitor in each process instead)
    assert parsed["rl/B/wandb"] == [None, None] and parsed["sft/B/wandb"] == [None]
    for mode in ("online", "offline"):
        assert parsed[f"rl/B/wandb-{mode}/wandb"] == [["predict", "rl/B/seed42", mode == "offline"]] * 2, parsed
        assert parsed[f"sft/B/wandb-{mode}/wandb"] == [["predict", "sft/B", mode == "offline"]], parsed
    assert parsed["rl/A"][:3] == ["GRPOStdAlgoConfig", "MbppTasksetConfig", "LocalAgentHarnessConfig"]
    assert parsed["rl/B"][0] == "PredictAlgoConfig" and parsed["rl/forced_keep"][3] == "forced_keep"
    # prime-rl's trainer writes HF weights to <output_dir>/weights/step_N (what collect_rl_checkpoints moves);
    # the group size and the algorithm reach the env
    assert parsed["rl/B"][4:] == [
        str((tmp_path / "out").absolute()),
        True,
        cfg["rl"]["group_size"],
        "predict",
    ]
    assert parsed["sft/B"] == [str((tmp_path / "data").absolute()), "qwen3", -1, cfg["prime_rl"]["attn"]]
    # a bare vLLM engine (no vllm-router program is installed) that the orchestrator reaches at its port; NCCL weights
    # across GPUs, the filesystem when inference and trainer share one; PyTorch's FA2 behind prime-rl's FA2 path
    assert parsed["rl/B/serving"] == [None, 0.9, "nccl", "nccl", "nccl", "flash_attention_3",
                                      ["http://localhost:8000/v1"], 8000]
    assert parsed["rl/B/colocated/serving"] == [None, 0.3, "filesystem", "filesystem", "filesystem",
                                                "flash_attention_2", ["http://localhost:8000/v1"], 8000]
    # one rl: design, a resuming retry, the kernel that was installed, the seed's task order, as prime-rl reads them
    rl = cfg["rl"]
    for run in study_runs(cfg):
        assert parsed[f"rl/{run}/design"] == [
            "custom",
            "predict.train.prime_rl.loss.clipped_surrogate",
            {"eps_low": rl["eps_low"], "eps_high": rl["eps_high"], "kl_coef": rl["kl_coef"]},
            -1,
            -1,
            cfg["prime_rl"]["attn"],
            "float32",
            [["gibberish", False], ["repetition", False], ["zero_advantage", True]],
            42,
            str((tmp_path / "sft").absolute()),  # the shared model reaches the trainer beside our model settings
        ]


def test_rendered_rl_tomls_survive_the_rl_launchers_own_rewrite(
    rendered: tuple[Path, dict[str, Any], dict[str, Any]],
) -> None:
    """prime-rl's ``rl`` launcher writes each process its own TOML (`write_subconfigs`: ``to_toml_dict`` then
    ``tomli_w``) and the orchestrator parses it again. TOML has no null: a None left inside our harness config (the
    protocol's ``max_model_calls``, a dataclass that prime-rl's encoder does not walk) crashed every rl run at start
    on the H200 (issue 39). Every run's orchestrator table must write and read back to the same environment."""

    _, _, parsed = rendered
    cfg = load_config(REPO_ROOT / "config" / "config.yaml")
    assert set(parsed) == set(study_runs(cfg))
    for run, (same, protocol) in parsed.items():
        assert same, (run, protocol)
        assert protocol["budget"] >= cfg["env"]["budget"] and protocol.get("max_model_calls") is None, (run, protocol)


def test_setup_checkout_and_patch_are_idempotent(tmp_path: Path) -> None:
    """cluster.checkout + apply_patch on a git repository holding the pinned files: a second run resets the tracked
    files, drops the shim and applies the patch again (the setup rule can be re-run)."""
    from predict.train.prime_rl.cluster import PrimeRLSetupError, apply_patch, checkout

    src = _source(tmp_path)
    origin = tmp_path / "origin"
    for part in ("src/prime_rl/orchestrator/algo", "packages/prime-rl-configs"):  # the pinned files, no submodules
        (origin / part).parent.mkdir(parents=True, exist_ok=True)
        subprocess.run(["cp", "-r", str(src / part), str(origin / part)], check=True)
    git = ["git", "-c", "user.email=t@t", "-c", "user.name=t"]
    subprocess.run([*git, "init", "-q"], cwd=origin, check=True)
    subprocess.run([*git, "add", "-A"], cwd=origin, check=True)
    subprocess.run([*git, "commit", "-qm", "pinned files"], cwd=origin, check=True)
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=origin, capture_output=True, text=True).stdout.strip()
    dest = tmp_path / "checkout"
    for _ in range(2):
        checkout(str(origin), commit, dest)
        assert not (dest / SHIM).exists()
        apply_patch(dest)
        assert '"predict": PredictAlgorithm' in (dest / REGISTRY).read_text() and (dest / SHIM).exists()
    with pytest.raises(PrimeRLSetupError, match="does not apply"):
        apply_patch(dest)  # already applied, without a reset
