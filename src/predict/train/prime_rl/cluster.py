"""Set prime-rl up at the pinned commit with our algorithm registered, and launch its ``rl`` / ``sft``.

`setup_prime_rl` (stage ``predict prime-rl-setup``), idempotent:

1. clone ``repo`` (a URL, or a local clone on a cluster without network) into ``dest``, fetch and check out
   ``commit`` detached, discarding local changes to tracked files (so a re-run re-applies the patch cleanly);
2. ``git submodule update --init --recursive`` (verifiers, renderers, ... at prime-rl's own pins) with GitHub's
   SSH URLs rewritten to https (`submodule_env`, as prime-rl's own scripts/install.sh does without an SSH key);
3. ``git apply`` ``workflow/prime-rl/predict-algorithm.patch`` (checked first; the error names the patch), then the
   patches the attention kernel needs (`configs.attention_patches`: ``torch-attention.patch`` for
   ``prime_rl.attn: flash_attention_2_torch``, none otherwise);
4. ``uv sync --locked`` (plus ``extras``: the attention kernel's, `configs.check_attn_extras`) in ``dest``:
   prime-rl's own venv ``dest/.venv``, Python ``python``; uv must be >= prime-rl's ``required-version``
   (`check_uv`, whose error says how to install it);
5. install this repository into that venv, editable and without dependencies (prime-rl's lock pins verifiers,
   torch, transformers; ours would fight them), then import-check ``PredictAlgorithm`` under ``predict``, the
   taskset ``predict_mbpp`` and the harness ``predict_local_agent`` in that venv;
6. write ``setup.json`` (repo, commit, patch sha256) as the rule's output.

`launch` (stage ``predict prime-rl-train``) runs ``uv run <rl|sft> @ <toml>`` in ``dest`` (a colocated ``rl`` run,
``prime_rl.rl.colocate``, with each of the job's GPUs listed twice in CUDA_VISIBLE_DEVICES: prime-rl's launcher
then places inference and trainer on the same GPUs) and then collects the
finished checkpoints (`collect.collect_rl_checkpoints` / `collect_sft_checkpoint`). The TOML resumes
(``ckpt.resume_step = -1``), so a SLURM retry is a second attempt in the same output_dir: before an ``rl`` attempt
`align_checkpoints` leaves the trainer and the orchestrator one common step to resume from; `launch` records where
each attempt starts in prime-rl's metrics.jsonl files (`mark_attempt`) and, once the run finishes, keeps only the
last attempt's records of each step (`drop_superseded_metrics`; the dropped lines go to ``*.superseded.jsonl``).
An ``rl`` run is watched while it runs (`run_watched`): once a logged step has more failed rollouts than the TOML's
``env_vars.PREDICT_MAX_FAILED_SHARE`` (``prime_rl.rl.max_failed_share``) allows, `collect.check_failed_rollouts`
raises, the run's processes are stopped and the job fails naming the step; so it does, before the step ends, once
the failures the orchestrator logs already pass what the step in progress may hold (`collect.check_open_step`: prime-rl
resamples failed rollouts without end, so a run whose every rollout fails would never log a step). Below it prime-rl
drops each failed rollout from its group (the environment marks a failed model call as a failed rollout, `predict.env.program`).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import shutil
import signal
import subprocess
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from predict.config import REPO_ROOT
from predict.fingerprint import file_sha256, fingerprint, mark_finished, start_or_resume
from predict.train.prime_rl.collect import (
    METRIC_SOURCES,
    ORCHESTRATOR_LOG,
    STABLE,
    check_failed_rollouts,
    check_open_step,
    step_folders,
)
from predict.train.prime_rl.configs import COLOCATE_VAR, MAX_FAILED_SHARE_VAR, colocated_devices, read_toml

if TYPE_CHECKING:
    from predict.stages import StageSettings

log = logging.getLogger(__name__)
PATCHES_DIR = REPO_ROOT / "workflow" / "prime-rl"
PATCH = PATCHES_DIR / "predict-algorithm.patch"
IMPORT_CHECK = (
    "import prime_rl.orchestrator.algo as a; from prime_rl.configs.algorithm import PredictAlgoConfig; "
    "assert a.ALGORITHM_CLASSES['predict'].__module__ == 'predict.train.prime_rl.algorithm'; "
    "assert a.ALGORITHM_CLASSES['grpo_std'].__module__ == 'predict.train.prime_rl.algorithm'; "
    "import predict.train.prime_rl.loss; "
    "import predict_mbpp, predict_local_agent; print('predict algorithm, taskset and harness import')"
)


WATCH_POLL_S = 30.0
"""How often `launch` checks a running ``rl`` run's logged steps for failed rollouts (seconds)."""


class PrimeRLSetupError(RuntimeError):
    """A setup or launch step failed (the message names the command)."""


UV_MIN_VERSION = (0, 11, 1)  # prime-rl's pyproject at the pin: [tool.uv] required-version = ">=0.11.1"
UV_INSTALL_HINT = "pip install 'uv>=0.11.1' (or: curl -LsSf https://astral.sh/uv/install.sh | sh)"
GITHUB_HTTPS = "https://github.com/"


def _run(argv: Sequence[str], cwd: str | Path | None = None, env: dict[str, str] | None = None) -> None:
    log.info("$ %s", " ".join(map(str, argv)))
    result = subprocess.run(list(map(str, argv)), cwd=cwd, env=env)
    if result.returncode != 0:
        raise PrimeRLSetupError(f"exit {result.returncode}: {' '.join(map(str, argv))}")


def run_watched(argv: Sequence[str], check: Callable[[], None], *, cwd: str | Path | None = None,
                poll_s: float = 30.0, stop_s: float = 60.0, env: dict[str, str] | None = None) -> None:
    """`_run`, calling `check` every `poll_s` seconds while the command runs and once after it exits. When `check`
    raises (or this process is interrupted) the command's process group (it runs in its own session: prime-rl
    starts inference, orchestrator and trainer under it) gets SIGTERM, SIGKILL after `stop_s`, and the error
    propagates."""
    log.info("$ %s", " ".join(map(str, argv)))
    proc = subprocess.Popen(list(map(str, argv)), cwd=cwd, start_new_session=True, env=env)
    try:
        while True:
            try:
                proc.wait(timeout=poll_s)
                break
            except subprocess.TimeoutExpired:
                check()
        check()
    except BaseException:
        _stop_group(proc, stop_s)
        raise
    if proc.returncode != 0:
        raise PrimeRLSetupError(f"exit {proc.returncode}: {' '.join(map(str, argv))}")


def _stop_group(proc: subprocess.Popen, stop_s: float) -> None:
    for sig, wait_s in ((signal.SIGTERM, stop_s), (signal.SIGKILL, None)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        try:
            proc.wait(timeout=wait_s)
            break
        except subprocess.TimeoutExpired:
            continue


def _ok(argv: Sequence[str], cwd: str | Path | None = None) -> bool:
    return subprocess.run(list(map(str, argv)), cwd=cwd, capture_output=True).returncode == 0


def submodule_env(
    base: str = GITHUB_HTTPS, extra: Sequence[tuple[str, str]] = (), environ: dict[str, str] | None = None
) -> dict[str, str]:
    """The environment for ``git submodule update``: ``git@github.com:`` URLs (prime-rl's .gitmodules) read as
    `base` (https). Passed through GIT_CONFIG_* so it reaches the clones git spawns for submodules, which do not
    read the parent's .git/config (prime-rl's scripts/install.sh does the same)."""
    env = dict(os.environ if environ is None else environ)
    pairs = [(f"url.{base}.insteadOf", "git@github.com:"), *extra]
    start = int(env.get("GIT_CONFIG_COUNT", "0"))
    for i, (key, value) in enumerate(pairs, start=start):
        env[f"GIT_CONFIG_KEY_{i}"], env[f"GIT_CONFIG_VALUE_{i}"] = key, value
    env["GIT_CONFIG_COUNT"] = str(start + len(pairs))
    return env


def check_uv(uv: str = "uv") -> tuple[int, ...]:
    """uv's version, or a PrimeRLSetupError saying how to install one prime-rl accepts."""
    try:
        out = subprocess.run([uv, "--version"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        raise PrimeRLSetupError(
            f"uv not found ({uv!r}): prime-rl installs with uv >= 0.11.1; {UV_INSTALL_HINT}"
        ) from None
    match = re.search(r"(\d+)\.(\d+)\.(\d+)", out)
    version = tuple(int(x) for x in match.groups()) if match else (0,)
    if version < UV_MIN_VERSION:
        raise PrimeRLSetupError(f"{uv} is {out.strip()!r}; prime-rl needs uv >= 0.11.1: {UV_INSTALL_HINT}")
    return version


def uv_sync_argv(uv: str, python: str, extras: Sequence[str]) -> list[str]:
    """``uv sync --locked``: exactly prime-rl's uv.lock (an error, not a re-resolve, if it does not match)."""
    return [uv, "sync", "--locked", "--python", python, *[f"--extra={e}" for e in extras]]


def checkout(repo: str, commit: str, dest: str | Path, *, submodule_base: str = GITHUB_HTTPS) -> None:
    """Steps 1-2: ``dest`` at ``commit``, tracked files as committed, submodules initialised over https."""
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
    _run(["git", "submodule", "update", "--init", "--recursive"], cwd=dest, env=submodule_env(submodule_base))


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
    python: str,
    patch: str | Path = PATCH,
    extras: Sequence[str] = (),
    out: str | Path | None = None,
    uv: str = "uv",
    attention_patches: Sequence[str | Path] = (),
) -> dict[str, Any]:
    dest = Path(dest)
    check_uv(uv)
    checkout(repo, commit, dest)
    apply_patch(dest, patch)
    for extra_patch in attention_patches:
        apply_patch(dest, extra_patch)
    _run(uv_sync_argv(uv, python, extras), cwd=dest)
    venv_python = dest / ".venv" / "bin" / "python"
    _run([uv, "pip", "install", "--python", venv_python, "--no-deps", "-e", REPO_ROOT])
    _run([venv_python, "-c", IMPORT_CHECK], cwd=dest)
    summary = {"repo": repo, "commit": commit, "patch_sha256": file_sha256(patch), "python": str(venv_python),
               "attention_patches": {Path(x).name: file_sha256(x) for x in attention_patches}}
    if out is not None:
        from predict.outputs import write_json

        write_json(summary, out)
    return summary


def _local_paths(value: Any, prefix: str = "") -> dict[str, str]:
    """{dotted key: path} of every absolute path a rendered TOML names that exists here (model, tasks, dataset)."""
    if isinstance(value, dict):
        return {k: v for key, item in value.items() for k, v in _local_paths(item, f"{prefix}{key}.").items()}
    if isinstance(value, list):
        return {k: v for i, item in enumerate(value) for k, v in _local_paths(item, f"{prefix}{i}.").items()}
    if isinstance(value, str) and value.startswith("/") and Path(value).exists():
        return {prefix.rstrip("."): value}
    return {}


def output_dir_fingerprint(table: dict[str, Any]) -> Any:
    """What shapes a prime-rl run (`predict.fingerprint`): its rendered TOML (every key but ``output_dir``) and the
    content of every local path it names (the start checkpoint, the task split, the SFT dataset, the tokenizer)."""
    output_dir = Path(table["output_dir"])
    paths = {k: v for k, v in _local_paths(table).items() if k != "output_dir" and output_dir not in Path(v).parents}
    return fingerprint(table, [k for k in table if k != "output_dir"], inputs=paths)


def launch(kind: str, toml: str | Path, dest: str | Path, *, uv: str = "uv") -> None:
    """Run prime-rl's ``rl`` or ``sft`` entry point on a rendered TOML, in its venv: one attempt (module doc). Its
    ``output_dir`` (prime-rl's checkpoints, weights and metrics) is kept only when it was made from the same TOML and
    inputs; otherwise it is emptied first, so a new run never resumes, collects or reports an older one's steps."""
    if kind not in ("rl", "sft"):
        raise ValueError(f"kind must be rl or sft, got {kind!r}")
    table = read_toml(toml)
    output_dir = Path(table["output_dir"])
    start_or_resume(output_dir, output_dir_fingerprint(table), what=f"prime-rl {kind} ({toml})")
    if kind == "rl":  # colocated runs broadcast weights through files, others through NCCL (configs.rl_config)
        align_checkpoints(output_dir, weights_on_disk=(table.get("weight_broadcast") or {}).get("type") == "filesystem")
    marks = mark_attempt(output_dir)
    argv = [uv, "run", "--frozen", "--no-sync", kind, "@", Path(toml).absolute()]
    env = launch_env(kind, table)
    share = (table.get("env_vars") or {}).get(MAX_FAILED_SHARE_VAR)
    if kind == "rl" and share is not None:
        start = marks[METRIC_SOURCES["orchestrator"]][-1]  # an earlier attempt's steps are redone, not judged
        log = output_dir / ORCHESTRATOR_LOG
        log_start = log.stat().st_size if log.exists() else 0
        batch_size = (table.get("orchestrator") or {}).get("batch_size")  # prime-rl's default is never ours

        def check() -> None:  # the finished steps, then the one in progress (collect's docs)
            check_failed_rollouts(output_dir, float(share), start)
            if batch_size is not None:
                check_open_step(output_dir, float(share), int(batch_size), start, log_start)

        try:
            run_watched(argv, check, cwd=dest, poll_s=WATCH_POLL_S, env=env)
        finally:
            drop_superseded_metrics(output_dir)
        return
    _run(argv, cwd=dest, env=env)
    drop_superseded_metrics(output_dir)


def launch_env(kind: str, table: dict[str, Any], environ: dict[str, str] | None = None) -> dict[str, str]:
    """The environment prime-rl's launcher runs in: this one, and for a colocated ``rl`` run (the TOML's
    ``env_vars`` say so) CUDA_VISIBLE_DEVICES with the job's inference GPUs listed twice (`configs.colocated_devices`)."""
    env = dict(os.environ if environ is None else environ)
    if kind == "rl" and (table.get("env_vars") or {}).get(COLOCATE_VAR):
        gpus = int((table.get("deployment") or {}).get("num_infer_gpus", 1))
        env["CUDA_VISIBLE_DEVICES"] = colocated_devices(env.get("CUDA_VISIBLE_DEVICES"), gpus)
    return env


# ---------------------------------------------------------------------------------------------------------------
# Resume: one step for prime-rl's trainer and orchestrator
# ---------------------------------------------------------------------------------------------------------------
def align_checkpoints(output_dir: str | Path, *, weights_on_disk: bool) -> int | None:
    """Make a retried ``rl`` run resume its trainer and orchestrator from one step, and return it (None: from
    scratch).

    The TOML's ``ckpt.resume_step = -1`` lets prime-rl's trainer and orchestrator each take the newest step folder
    they find, but the orchestrator runs up to ``max_off_policy_steps`` ahead of the trainer and checkpoints as it
    goes. On the H200 a run killed in its step 2 held trainer checkpoints 1-2 and orchestrator checkpoints 1-3, and
    its retry stopped with "No weight directory found for checkpoint step 3" (docs/prime-rl.md). The step resumed is
    the newest that both checkpointed in full (the trainer's DCP ``.metadata``, written last; the orchestrator's
    ``progress.pt``, written by rename) and, when weights go through files (``weights_on_disk``: prime-rl's
    filesystem broadcast; NCCL hands them over in memory at start), whose weights the inference server can load (a
    broadcast or checkpoint folder marked STABLE, where prime-rl's orchestrator looks). Step folders past it, on
    either side, cannot be resumed and are deleted, so that ``-1`` resolves to that step in prime-rl's launcher,
    trainer and orchestrator.
    With no such step, the orchestrator's folders go too (the run starts from scratch), unless the trainer saved a
    step in full: then `PrimeRLSetupError`, since deleting would throw trained steps away."""
    output_dir = Path(output_dir)
    run = output_dir / "run_default"  # the orchestrator's output_dir under the rl launcher
    trainer, orchestrator = step_folders(output_dir / "checkpoints"), step_folders(run / "checkpoints")
    trained = sorted(s for s, d in trainer.items() if (d / "trainer" / ".metadata").exists())
    resumable = [
        s for s in trained
        if s in orchestrator and (orchestrator[s] / "orchestrator" / "progress.pt").exists()
        and (not weights_on_disk
             or any((d / STABLE).exists() for d in (run / "broadcasts" / f"step_{s}", orchestrator[s])))
    ]
    step = resumable[-1] if resumable else None
    if step is None and trained:  # never throw trained steps away: e.g. a ckpt.keep_last that pruned the common step
        raise PrimeRLSetupError(
            f"prime-rl rl in {output_dir}: the trainer's checkpoints (steps {trained}) and the orchestrator's (steps "
            f"{sorted(orchestrator)}) share no step saved in full with its weights, so neither can resume the other. "
            "Set ckpt.resume_step to a step both can load, or empty the folder to train from scratch"
        )
    for folder in [d for s, d in (*trainer.items(), *orchestrator.items()) if step is None or s > step]:
        log.warning("prime-rl rl: deleting %s, which cannot be resumed with the other side's state (resuming from %s)",
                    folder, "scratch" if step is None else f"step {step}")
        shutil.rmtree(folder)
    return step


# ---------------------------------------------------------------------------------------------------------------
# Attempts: a retried job appends to prime-rl's metrics.jsonl files; keep the last attempt's records of each step
# ---------------------------------------------------------------------------------------------------------------
METRICS_FILES = tuple(METRIC_SOURCES.values())  # prime-rl's trainer's and orchestrator's
ATTEMPTS = "predict-attempts.json"
"""In output_dir: per metrics file, the byte offset where each attempt started."""


def mark_attempt(output_dir: str | Path) -> dict[str, list[int]]:
    """Record where the attempt about to start begins in each metrics file (its current size)."""
    from predict.outputs import write_json

    output_dir = Path(output_dir)
    path = output_dir / ATTEMPTS
    marks: dict[str, list[int]] = json.loads(path.read_text()) if path.exists() else {}
    for name in METRICS_FILES:
        f = output_dir / name
        size = f.stat().st_size if f.exists() else 0
        starts = marks.setdefault(name, [])
        if not starts or starts[-1] != size:
            starts.append(size)
    write_json(marks, path)  # makes output_dir if need be
    return marks


def last_attempt_records(attempts: Sequence[Sequence[str]]) -> tuple[list[str], list[str]]:
    """(kept, superseded) lines of attempts in order: an attempt that logs from step s on supersedes every earlier
    record of step >= s (those steps were redone, or lost with the checkpoint it resumed before). Torn lines
    (a killed write) are superseded."""
    kept: list[tuple[int, str]] = []
    dropped: list[str] = []
    for lines in attempts:
        records: list[tuple[int, str]] = []
        for line in lines:
            try:
                step = json.loads(line)["step"]
            except (json.JSONDecodeError, KeyError, TypeError):
                dropped.append(line)
                continue
            records.append((int(step), line))
        if records:
            first = min(step for step, _ in records)
            dropped += [line for step, line in kept if step >= first]
            kept = [(step, line) for step, line in kept if step < first]
        kept += records
    return [line for _, line in kept], dropped


def drop_superseded_metrics(output_dir: str | Path) -> dict[str, int]:
    """Rewrite each metrics.jsonl with only the last attempt's records of each step (atomically; the dropped lines
    are appended to ``<name>.superseded.jsonl``); returns the dropped count per file. Then one attempt remains."""
    from predict.outputs import write_json, write_text

    output_dir = Path(output_dir)
    path = output_dir / ATTEMPTS
    marks: dict[str, list[int]] = json.loads(path.read_text()) if path.exists() else {}
    dropped_counts: dict[str, int] = {}
    for name in METRICS_FILES:
        f = output_dir / name
        if not f.exists():
            continue
        data = f.read_bytes()
        starts = sorted({0, *[s for s in marks.get(name, []) if 0 < s <= len(data)]})
        bounds = [*starts, len(data)]
        attempts = [data[a:b].decode(errors="replace").splitlines() for a, b in zip(bounds, bounds[1:], strict=False)]
        kept, dropped = last_attempt_records([[line for line in lines if line.strip()] for lines in attempts])
        dropped_counts[name] = len(dropped)
        if dropped:
            with open(f.with_suffix(".superseded.jsonl"), "a") as out:
                out.writelines(line + "\n" for line in dropped)
            write_text("".join(line + "\n" for line in kept), f)
        marks[name] = [0]  # one attempt now
    if marks:
        write_json(marks, path)
    return dropped_counts


# The prime-rl backend's three commands: `predict prime-rl-setup`, `prime-rl-config` and `prime-rl-train`.
def setup_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--dir", required=True, help="where the checkout and its .venv live")
    p.add_argument("--patch", default=None, help="default: workflow/prime-rl/predict-algorithm.patch")
    p.add_argument("--patches-dir", default=None,
                   help="where the attention patches live (default: workflow/prime-rl/; configs.attention_patches)")
    p.add_argument("--out", required=True, help="setup.json")


def setup_main(args: argparse.Namespace, config: StageSettings) -> int:
    """prime-rl at config prime_rl.commit from prime_rl.repo, its venv on prime_rl.python with prime_rl.extras."""
    from predict.outputs import console
    from predict.train.prime_rl.configs import attention_patches

    prime_rl = config.prime_rl
    patches_dir = Path(args.patches_dir) if args.patches_dir else PATCHES_DIR
    summary = setup_prime_rl(
        prime_rl.repo, prime_rl.commit, args.dir, patch=args.patch or PATCH,
        python=prime_rl.python, extras=prime_rl.extras, out=args.out,
        attention_patches=[patches_dir / name for name in attention_patches(config)],
    )
    console.print(f"prime-rl at {summary['commit'][:12]} in {args.dir}, PredictAlgorithm registered")
    return 0


def config_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("kind", choices=["rl", "sft"])
    p.add_argument("--model", required=True, help="start checkpoint: folder or HF id")
    p.add_argument("--output-dir", required=True, help="prime-rl's output_dir")
    p.add_argument("--out", required=True, help="the TOML to write")
    p.add_argument("--run", help="rl: an arm or an ablation (alpha0, forced_keep, budget_neutral)")
    p.add_argument("--seed", type=int, help="rl")
    p.add_argument("--tasks-file", help="rl: the rl split parquet")
    p.add_argument("--arm", help="sft")
    p.add_argument("--traces", help="sft: results/sft/traces/{arm}.parquet (column messages)")
    p.add_argument("--dataset-dir", help="sft: where to write the messages dataset")


def config_main(args: argparse.Namespace, config: StageSettings) -> int:
    """The TOML from the stage's typed slice (`configs.rl_config`, `configs.sft_config`)."""
    from predict.outputs import console
    from predict.train.prime_rl import collect, configs

    if args.kind == "rl":
        if args.run is None or args.seed is None or args.tasks_file is None:
            raise ValueError("prime-rl-config rl needs --run, --seed and --tasks-file")
        table = configs.rl_config(
            config, args.run, args.seed, model=args.model, tasks=args.tasks_file, output_dir=args.output_dir
        )
    else:
        if args.arm is None or args.traces is None or args.dataset_dir is None:
            raise ValueError("prime-rl-config sft needs --arm, --traces and --dataset-dir")
        data = collect.write_sft_dataset(args.traces, args.dataset_dir)
        console.print(f"SFT dataset: {data}")
        table = configs.sft_config(
            config, args.arm, model=args.model, dataset_dir=args.dataset_dir, output_dir=args.output_dir
        )
    configs.write_toml(table, args.out)
    console.print(f"prime-rl {args.kind} config: {args.out}")
    return 0


def train_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("kind", choices=["rl", "sft"])
    p.add_argument("--toml", required=True)
    p.add_argument("--dir", required=True, help="the prime-rl checkout (prime-rl-setup --dir)")
    p.add_argument("--run-dir", help="rl: results/rl/{run}/seed{seed}: steps land in step{N}/")
    p.add_argument("--checkpoints-out", help="rl: checkpoints.json")
    p.add_argument("--checkpoint", help="sft: results/checkpoints/{arm}/sft")
    p.add_argument("--tensorboard-dir", default=None,
                   help="rl: mirror the collected metrics into this TensorBoard root (results/tensorboard), unless "
                        "config tracking.tensorboard is off")
    p.add_argument("--metrics-out", help="rl: the per-step metrics table; sft: prime-rl's metrics as parquet "
                   "(default: next to --run-dir / the TOML)")
    p.add_argument("--raw-metrics-out", help="rl: prime-rl's metrics as a long table (default: "
                   "<run-dir>/prime-rl-metrics.parquet)")
    p.add_argument("--run", help="rl: the run (default: the --run-dir's parent folder's name)")
    p.add_argument("--seed", type=int, help="rl: the seed (default: from the --run-dir's name, seed<N>)")


def train_main(args: argparse.Namespace, config: StageSettings) -> int:
    from predict.outputs import console
    from predict.train.prime_rl import collect, configs

    launch(args.kind, args.toml, args.dir)
    output_dir = configs.read_toml(args.toml)["output_dir"]
    if args.kind == "rl":
        if args.run_dir is None or args.checkpoints_out is None:
            raise ValueError("prime-rl-train rl needs --run-dir and --checkpoints-out")
        summary = collect.collect_rl_checkpoints(output_dir, args.run_dir, args.checkpoints_out)
        console.print(f"RL checkpoints: steps {summary['steps']} under {args.run_dir}")
        run_dir = Path(args.run_dir)
        run, seed = args.run or run_dir.parent.name, args.seed
        if seed is None and not run_dir.name.removeprefix("seed").isdigit():
            raise ValueError(f"--run-dir {run_dir}: not results/rl/<run>/seed<N>; pass --run and --seed")
        seed = int(run_dir.name.removeprefix("seed")) if seed is None else seed
        metrics = Path(args.metrics_out or run_dir / "metrics.parquet")
        raw = Path(args.raw_metrics_out or run_dir / "prime-rl-metrics.parquet")
        n = collect.write_rl_metrics(output_dir, metrics, raw, run=run, seed=seed)
        console.print(f"metrics: {n} steps -> {metrics} (prime-rl's own: {raw})")
        # prime-rl wrote its curves live to W&B; TensorBoard gets them at collection
        if args.tensorboard_dir and config.tracking.tensorboard:
            collect.mirror_metrics(metrics, Path(args.tensorboard_dir), run=run, seed=seed)
            console.print(f"TensorBoard: {args.tensorboard_dir}")
    else:
        if args.checkpoint is None:
            raise ValueError("prime-rl-train sft needs --checkpoint")
        step = collect.collect_sft_checkpoint(output_dir, args.checkpoint)
        console.print(f"SFT checkpoint (step {step}): {args.checkpoint}")
        metrics = Path(args.metrics_out or Path(args.toml).parent / "metrics.parquet")
        n = collect.write_metrics(output_dir, metrics)
        console.print(f"metrics: {n} values -> {metrics}")
    mark_finished(output_dir)  # collected: a later run of this job trains again (predict.fingerprint)
    return 0
