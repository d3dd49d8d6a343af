"""Set prime-rl up at the pinned commit with our algorithm registered, and launch its ``rl`` / ``sft``.

`setup_prime_rl` (stage ``predict prime-rl-setup``), idempotent:

1. clone ``repo`` (a URL, or a local clone on a cluster without network) into ``dest``, fetch and check out
   ``commit`` detached, discarding local changes to tracked files (so a re-run re-applies the patch cleanly);
2. ``git submodule update --init --recursive`` (verifiers, renderers, ... at prime-rl's own pins);
3. ``git apply`` ``workflow/prime-rl/predict-algorithm.patch`` (checked first; the error names the patch);
4. ``uv sync`` (plus ``extras``) in ``dest``: prime-rl's own venv ``dest/.venv``, Python ``python``;
5. install this repository into that venv, editable and without dependencies (prime-rl's lock pins verifiers,
   torch, transformers; ours would fight them), then import-check ``PredictAlgorithm`` under ``predict``, the
   taskset ``predict_mbpp`` and the harness ``predict_local_agent`` in that venv;
6. write ``setup.json`` (repo, commit, patch sha256) as the rule's output.

`launch` (stage ``predict prime-rl-train``) runs ``uv run <rl|sft> @ <toml>`` in ``dest`` and then collects the
finished checkpoints (`configs.collect_rl_checkpoints` / `collect_sft_checkpoint`).
"""

from __future__ import annotations

import hashlib
import logging
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from predict.config import REPO_ROOT

log = logging.getLogger(__name__)
PATCH = REPO_ROOT / "workflow" / "prime-rl" / "predict-algorithm.patch"
IMPORT_CHECK = (
    "import prime_rl.orchestrator.algo as a; from prime_rl.configs.algorithm import PredictAlgoConfig; "
    "assert a.ALGORITHM_CLASSES['predict'].__module__ == 'predict.train.prime_rl.algorithm'; "
    "import predict_mbpp, predict_local_agent; print('predict algorithm, taskset and harness import')"
)


class PrimeRLSetupError(RuntimeError):
    """A setup or launch step failed (the message names the command)."""


def _run(argv: Sequence[str], cwd: str | Path | None = None, env: dict[str, str] | None = None) -> None:
    log.info("$ %s", " ".join(map(str, argv)))
    result = subprocess.run(list(map(str, argv)), cwd=cwd, env=env)
    if result.returncode != 0:
        raise PrimeRLSetupError(f"exit {result.returncode}: {' '.join(map(str, argv))}")


def _ok(argv: Sequence[str], cwd: str | Path | None = None) -> bool:
    return subprocess.run(list(map(str, argv)), cwd=cwd, capture_output=True).returncode == 0


def sha256(path: str | Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def checkout(repo: str, commit: str, dest: str | Path) -> None:
    """Steps 1-2: ``dest`` at ``commit``, tracked files as committed, submodules initialised."""
    dest = Path(dest)
    if not (dest / ".git").exists():
        _run(["git", "clone", "--no-checkout", repo, dest])
    if not _ok(["git", "cat-file", "-e", f"{commit}^{{commit}}"], cwd=dest):
        _run(["git", "fetch", "origin", commit], cwd=dest)
    _run(["git", "checkout", "--force", "--detach", commit], cwd=dest)
    # Our patch adds one untracked file; drop it (and only it) so the patch re-applies.
    shim = dest / "src" / "prime_rl" / "orchestrator" / "algo" / "predict.py"
    if shim.exists() and not _ok(["git", "ls-files", "--error-unmatch", shim], cwd=dest):
        shim.unlink()
    _run(["git", "submodule", "update", "--init", "--recursive"], cwd=dest)


def apply_patch(dest: str | Path, patch: str | Path = PATCH) -> None:
    """Step 3: apply the registration patch (checked first)."""
    if not _ok(["git", "apply", "--check", patch], cwd=dest):
        raise PrimeRLSetupError(f"{patch} does not apply to {dest}: is it at the pinned commit? (git apply --check)")
    _run(["git", "apply", patch], cwd=dest)


def setup_prime_rl(
    repo: str,
    commit: str,
    dest: str | Path,
    *,
    patch: str | Path = PATCH,
    python: str = "3.12",
    extras: Sequence[str] = (),
    out: str | Path | None = None,
    uv: str = "uv",
) -> dict[str, Any]:
    dest = Path(dest)
    checkout(repo, commit, dest)
    apply_patch(dest, patch)
    _run([uv, "sync", "--python", python, *[f"--extra={e}" for e in extras]], cwd=dest)
    venv_python = dest / ".venv" / "bin" / "python"
    _run([uv, "pip", "install", "--python", venv_python, "--no-deps", "-e", REPO_ROOT])
    _run([venv_python, "-c", IMPORT_CHECK], cwd=dest)
    summary = {"repo": repo, "commit": commit, "patch_sha256": sha256(patch), "python": str(venv_python)}
    if out is not None:
        from predict.io import write_json

        write_json(summary, out)
    return summary


def launch(kind: str, toml: str | Path, dest: str | Path, *, uv: str = "uv", extra_args: Sequence[str] = ()) -> None:
    """Run prime-rl's ``rl`` or ``sft`` entry point on a rendered TOML, in its venv."""
    if kind not in ("rl", "sft"):
        raise ValueError(f"kind must be rl or sft, got {kind!r}")
    _run([uv, "run", "--frozen", "--no-sync", kind, "@", Path(toml).absolute(), *extra_args], cwd=dest)
