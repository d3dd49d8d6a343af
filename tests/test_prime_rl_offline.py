"""envs/prime-rl-offline-node.sh: prime-rl installed from wheels into a plain folder on a node without network or uv
(docs/prime-rl.md, "Seen on a GPU"). What the H200 run found: a second install (more wheels, a later call) must
keep prime-rl's console scripts, a script must run its ``main`` only as ``__main__`` (prime-rl's env server spawns
workers that import the script again), and `predict prime-rl-train`'s ``uv run --frozen --no-sync CMD`` must reach
CMD. A stand-in ``prime-rl`` wheel (same dist name, entry points of the same shape) is built here, offline."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest

from predict.config import REPO_ROOT

NODE = REPO_ROOT / "envs" / "prime-rl-offline-node.sh"


def _wheel(tmp_path: Path, name: str, files: dict[str, str], scripts: dict[str, str]) -> Path:
    """A pure-Python wheel written by hand (no build backend needed, so no network and no setuptools)."""
    dist = name.replace("-", "_")
    info = f"{dist}-0.0.1.dist-info"
    meta = {
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.0.1\n",
        f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
        f"{info}/entry_points.txt": "[console_scripts]\n" + "".join(f"{k} = {v}\n" for k, v in scripts.items()),
    }
    entries = {**files, **meta}
    out = tmp_path / f"wheels-{name}"
    out.mkdir()
    with zipfile.ZipFile(out / f"{dist}-0.0.1-py3-none-any.whl", "w") as whl:
        for rel, text in entries.items():
            whl.writestr(rel, text)
        whl.writestr(f"{info}/RECORD", "".join(f"{rel},,\n" for rel in entries) + f"{info}/RECORD,,\n")
    return out


def test_node_install_keeps_the_console_scripts_and_uv_run_reaches_them(tmp_path: Path) -> None:
    main_py = textwrap.dedent(
        """
        import multiprocessing, sys

        def work(q):
            q.put("worker")

        def main():
            # spawn imports the main script again in the child: without a __main__ guard it would rerun main()
            ctx = multiprocessing.get_context("spawn")
            q = ctx.Queue()
            p = ctx.Process(target=work, args=(q,))
            p.start(); p.join()
            print("rl", sys.argv[1:], q.get())
            return 0
        """
    )
    prime = _wheel(tmp_path, "prime-rl", {"prime_rl/__init__.py": "", "prime_rl/entrypoints/__init__.py": "",
                                          "prime_rl/entrypoints/rl.py": main_py},
                   {"rl": "prime_rl.entrypoints.rl:main"})
    other = _wheel(tmp_path, "other-thing", {"other_thing/__init__.py": ""}, {"other": "other_thing:x"})
    site = tmp_path / "site"
    bin_dir = Path(sys.executable).parent
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    subprocess.run(["bash", NODE, site, prime], check=True, env=env, capture_output=True)
    # a later call installs more wheels: pip --target --upgrade replaces SITE/bin, the scripts must come back
    subprocess.run(["bash", NODE, site, other], check=True, env=env, capture_output=True)
    script = site / "bin" / "rl"
    assert script.exists() and 'if __name__ == "__main__":' in script.read_text()
    run_env = {**env, "PATH": f"{site / 'bin'}{os.pathsep}{env['PATH']}", "PYTHONPATH": str(site)}
    result = subprocess.run(["uv", "run", "--frozen", "--no-sync", "rl", "@", "x.toml"], env=run_env,
                            capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip().splitlines() == ["rl ['@', 'x.toml'] worker"]
    refused = subprocess.run(["uv", "sync"], env=run_env, capture_output=True, text=True, cwd=tmp_path)
    assert refused.returncode == 2 and "only 'uv run'" in refused.stderr


def test_a_later_install_into_a_package_already_there_keeps_what_the_first_put_there(tmp_path: Path) -> None:
    """prime-rl-configs installs into prime_rl/ (prime_rl/configs). Installed in a later call than prime-rl, it must
    not erase prime_rl/entrypoints: on the H200, `pip --target --upgrade` did ("No module named
    'prime_rl.entrypoints'"), and prime-rl's sft would not start."""
    prime = _wheel(tmp_path, "prime-rl", {"prime_rl/__init__.py": "", "prime_rl/entrypoints/__init__.py": "",
                                          "prime_rl/entrypoints/sft.py": "def main():\n    return 0\n"},
                   {"sft": "prime_rl.entrypoints.sft:main"})
    configs = _wheel(tmp_path, "prime-rl-configs", {"prime_rl/configs/__init__.py": "X = 1\n"}, {})
    site = tmp_path / "site"
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    subprocess.run(["bash", NODE, site, prime], check=True, env=env, capture_output=True)
    subprocess.run(["bash", NODE, site, configs], check=True, env=env, capture_output=True)
    probe = "import prime_rl.entrypoints.sft, prime_rl.configs; print(prime_rl.configs.X)"
    result = subprocess.run([sys.executable, "-c", probe], env={**env, "PYTHONPATH": str(site)},
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip() == "1"
    assert (site / "bin" / "sft").exists()


# What prime-rl, prime-rl-configs and its pinned verifiers declare that envs/prime-rl-offline.sh's wheel list does not
# carry, each with where it comes from instead. Everything else they declare must be in the node image's list
# (envs/offline-node-image.txt), in vLLM's site (../shared/tools/vllm-gpu/build_parts.sh), or in the wheel list.
ELSEWHERE = {
    "vllm": "vLLM's own site (../shared/tools/vllm-gpu)",
    "prime-rl-configs": "built from the pinned tree (prime-rl-offline.sh, step 1)",
    "verifiers": "built from the pinned tree (prime-rl-offline.sh, step 1)",
    "torchtitan": "a git-pinned tree (a *.tgz in OUT/partN)",
    "dion": "a git-pinned tree (a *.tgz in OUT/partN)",
    "mooncake-transfer-engine": "never imported on one GPU: prime-rl's multi-node KV transfer",
    "ring-flash-attn": "never imported on one GPU: context parallelism (cp = 1)",
    "openai-agents": "never imported: verifiers' agents integration, not its v1 harness",
}


def _names(requirements: list[str]) -> set[str]:
    return {re.split(r"[\[=<>~!; ]", r.strip().strip('"'))[0].lower().replace("_", "-") for r in requirements if r.strip()}


def test_the_offline_wheels_cover_what_prime_rl_declares() -> None:
    """On the H200, prime-rl stopped at "No module named 'renderers'" once the pipeline's wheels (which had brought
    renderers, prime-pydantic-config and verifiers' imports into vLLM's site) were kept apart: its own wheel list
    had never carried them."""
    import tomllib

    tree = Path(os.environ.get("PREDICT_PRIME_RL_SRC", "/nonexistent"))
    vllm_parts = REPO_ROOT.parent / "shared" / "tools" / "vllm-gpu" / "build_parts.sh"
    if not (tree / "pyproject.toml").is_file():
        from tests.test_prime_rl_patch import skip_unless_required

        skip_unless_required("needs PREDICT_PRIME_RL_SRC (the pinned tree)")
    if not vllm_parts.is_file():
        pytest.skip("needs ../shared/tools/vllm-gpu (what vLLM's site brings to the node)")
    declared: set[str] = set()
    for pyproject in (tree / "pyproject.toml", tree / "packages" / "prime-rl-configs" / "pyproject.toml",
                      tree / "deps" / "verifiers" / "pyproject.toml"):
        declared |= _names(tomllib.loads(pyproject.read_text())["project"]["dependencies"])
    image = _names([line for line in (REPO_ROOT / "envs" / "offline-node-image.txt").read_text().splitlines()
                    if not line.startswith("#")])
    script = (REPO_ROOT / "envs" / "prime-rl-offline.sh").read_text()
    wheels = _names(re.findall(r"([A-Za-z0-9_.-]+)==", script.split("wheels=(", 1)[1].split("\n)", 1)[0]))
    download = re.search(r"\$DL -d \.vp2/wheels (.*?)\n(?!\s)", vllm_parts.read_text(), flags=re.S)[1]
    vllm_site = _names(download.replace("\\\n", " ").split())
    missing = sorted(declared - image - wheels - vllm_site - set(ELSEWHERE))
    assert missing == [], f"prime-rl declares these, and no wheel, image or site on the node carries them: {missing}"


def test_the_gpu_check_derives_its_four_traces_on_the_node(tmp_path: Path) -> None:
    """envs/prime-rl-offline-check.sh's `data` phase (run by `sft` when no TRACES is given): the split and the traces
    from the pipeline's own stages, then arm B's first two direct and two recovery traces and their tasks. Until
    2026-12-05 these parquets were made by hand and carried to the H200; a fresh checkout had none."""
    import pyarrow.parquet as pq

    site = next(p for p in sys.path if p.endswith("site-packages"))
    env = {**os.environ, "R": str(tmp_path / "check"), "PIPE_SITE": site, "SERVING_PYTHON": sys.executable,
           "VLLM_SITE": str(tmp_path / "no-vllm"), "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    result = subprocess.run(["bash", str(REPO_ROOT / "envs" / "prime-rl-offline-check.sh"), "data"], cwd=REPO_ROOT,
                            env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    data = tmp_path / "check" / "data"
    traces = pq.read_table(data / "traces-B-4.parquet").to_pylist()
    assert sorted((r["role"], r["task_id"]) for r in traces) == [("direct", 1), ("direct", 20), ("recovery", 13),
                                                                  ("recovery", 21)]
    assert {r["arm"] for r in traces} == {"B"}
    assert sorted(r["task_id"] for r in pq.read_table(data / "tasks-4.parquet").to_pylist()) == [1, 13, 20, 21]
    assert pq.read_table(data / "val.parquet").num_rows == 50  # the paper split's val, what `resume` evaluates on
