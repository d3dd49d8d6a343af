"""Resumable state proves where it came from: a fingerprint of what shapes a stage's result, kept beside the state.

Rules:

1. A fingerprint has four parts: the stage's **config slice** (the dotted keys or sections it is given, e.g.
   ``("rl", "env", "model.enable_thinking")``, copied verbatim so a mismatch can name the key), the **identity of
   its inputs** (a file: the sha256 of its bytes; a folder such as a checkpoint: the sha256 of its manifest, every
   file's relative path, size and sha256; anything else, e.g. an HF id: the string itself), the **seed**, and
   **extra** values the stage resolves itself (the run's spec, an arm, a step limit). Paths are not part of an
   identity: a moved results folder still resumes, a retrained checkpoint at the same path does not.
2. A resumable folder (`results/sft/{arm}/state/`, an RL run's ``.work/``, a rollout's ``.partial/``, a prime-rl
   ``output_dir``) holds ``fingerprint.json``. `start_or_resume` writes it when the work starts fresh, *before*
   anything resumable is saved there, so whatever the folder holds was made under that fingerprint (a kill at any
   point leaves a folder that is either fresh or consistent).
3. Resume only when the stored fingerprint equals the new one and the folder is not marked finished. Otherwise log
   ONE line saying which parts differ (the config keys with old and new values, the inputs by name), empty the
   folder and start fresh. A folder without a fingerprint (made before this rule) is never resumed.
4. A stage that has published its outputs marks its folder finished (`mark_finished`): Snakemake only runs a job
   again when its outputs are missing or forced (``--forcerun``), and then the work is redone, never republished.
5. Hashing is cheap to repeat, and the cache is trusted by content: each file's sha256 is cached under
   ``.cache/sha256/`` (``PREDICT_HASH_CACHE`` overrides) keyed by its real path, size, mtime, ctime and inode, so a
   4B checkpoint is read once per content. The ctime is the kernel's: every write and every utime call moves it and
   no call sets it back, so a rewrite with the same size and its old mtime restored misses the cache. A digest is
   cached only when the file's ctime lies `RACY_NS` before the read began and the file did not change while it was
   read (a rewrite within one timestamp tick of the read could otherwise keep every stamp). The cost, side by side
   with hashing on every read: benchmarks/fingerprint_cache.py.
6. ``results/`` records which ``run_name`` made it (`claim_results_dir`, called where every stage loads its
   config); a stage of another run that would write there refuses with both names and the fix.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa

from predict.config.models import plain_data
from predict.outputs import ResumableParquet, write_json

log = logging.getLogger(__name__)

FINGERPRINT_FILE = "fingerprint.json"
RUN_NAME_FILE = ".run_name.json"
VERSION = 1
_ABSENT = "<absent>"

# What shapes each resumable stage's result, as config keys (sections or dotted keys). The run's own overlay
# (ablation / extension) enters as the resolved `RunSpec` in `extra`, so editing another run's entry resumes.
RESUME_KEYS: dict[str, tuple[str, ...]] = {
    "sft": ("sft", "model.enable_thinking"),
    "rollout": ("arms", "env", "verifier", "model.enable_thinking", "serving.max_model_len"),
    "rl": ("rl", "arms", "env", "verifier", "model.enable_thinking", "serving.max_model_len"),
    "rft": ("rl", "rft", "arms", "env", "verifier", "model.enable_thinking", "serving.max_model_len"),
}


class ResultsDirError(ValueError):
    """results_dir holds another run's results."""


# ----------------------------------------------------------------------------------------------------------------
# Input identities
# ----------------------------------------------------------------------------------------------------------------
def _cache_dir() -> Path:
    if env := os.environ.get("PREDICT_HASH_CACHE"):
        return Path(env)
    from predict.serving.server import default_cache_dir

    return default_cache_dir() / "sha256"


RACY_NS = 2_000_000_000
"""A digest is cached only for a file whose ctime is this much older than the read (rule 5): more than a
filesystem timestamp tick (2 s on the coarsest, FAT), so any later write gets a ctime the cache key has not seen."""


def _stamp(real: Path, st: os.stat_result) -> str:
    """What the hash cache is keyed on (rule 5)."""
    return f"{real}\0{st.st_size}\0{st.st_mtime_ns}\0{st.st_ctime_ns}\0{st.st_ino}\0{st.st_dev}"


def file_sha256(path: str | Path) -> str:
    """sha256 of a file's bytes, cached by (real path, size, mtime, ctime, inode, device): unchanged files are read
    once, and a rewrite is read again whatever stamps it restores (rule 5)."""
    real = Path(path).resolve()
    before = real.stat()
    key = hashlib.sha256(_stamp(real, before).encode()).hexdigest()
    cached = _cache_dir() / key[:2] / key
    try:
        digest = cached.read_text().strip()
        if len(digest) == 64:
            return digest
    except OSError:
        pass
    started = time.time_ns()
    with open(real, "rb") as f:
        digest = hashlib.file_digest(f, "sha256").hexdigest()
    if _stamp(real, real.stat()) != _stamp(real, before) or before.st_ctime_ns > started - RACY_NS:
        return digest  # changed while read, or too recently for its stamps to tell a rewrite: not cached
    try:  # a read-only home or cache only costs a re-read next time
        cached.parent.mkdir(parents=True, exist_ok=True)
        tmp = cached.with_name(f".{key}.{os.getpid()}")
        tmp.write_text(digest)
        os.replace(tmp, cached)
    except OSError:
        pass
    return digest


def folder_manifest(folder: str | Path) -> list[tuple[str, int, str]]:
    """(relative path, size, sha256) of every file under a folder, sorted; hidden names (temporary files of atomic
    writes, caches) are left out."""
    root = Path(folder)
    out = []
    for dirpath, dirnames, filenames in os.walk(root, followlinks=True):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        for name in sorted(filenames):
            if name.startswith("."):
                continue
            path = Path(dirpath) / name
            out.append((path.relative_to(root).as_posix(), path.stat().st_size, file_sha256(path)))
    return sorted(out)


def input_identity(value: str | Path) -> str:
    """``file:<sha256>``, ``folder:<sha256 of its manifest>`` or ``id:<value>`` (not a local path, e.g. an HF id)."""
    path = Path(value)
    if path.is_file():
        return f"file:{file_sha256(path)}"
    if path.is_dir():
        manifest = json.dumps(folder_manifest(path), separators=(",", ":"))
        return f"folder:{hashlib.sha256(manifest.encode()).hexdigest()}"
    return f"id:{value}"


# ----------------------------------------------------------------------------------------------------------------
# Fingerprints
# ----------------------------------------------------------------------------------------------------------------
def _canonical(value: Any) -> Any:
    """JSON's view of a value (tuples become lists, keys strings), so a stored fingerprint compares equal."""
    return json.loads(json.dumps(value, sort_keys=True, default=str))


def config_slice(config: Mapping[str, Any], keys: Iterable[str]) -> dict[str, Any]:
    """{dotted key: value} of the given sections/keys; a missing key is recorded as absent."""
    out: dict[str, Any] = {}
    for key in keys:
        node: Any = config
        for part in key.split("."):
            node = node.get(part, _ABSENT) if isinstance(node, Mapping) else _ABSENT
        out[key] = node
    return _canonical(out)


@dataclass(frozen=True)
class Fingerprint:
    """What shaped a piece of resumable state (see the module docstring)."""

    config: dict[str, Any]
    inputs: dict[str, str]
    seed: int | None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def digest(self) -> str:
        return hashlib.sha256(json.dumps(self.to_dict(), sort_keys=True).encode()).hexdigest()

    def to_dict(self) -> dict[str, Any]:
        return {"version": VERSION, "config": self.config, "inputs": self.inputs, "seed": self.seed,
                "extra": self.extra}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Fingerprint:
        return cls(config=dict(data.get("config") or {}), inputs=dict(data.get("inputs") or {}),
                   seed=data.get("seed"), extra=dict(data.get("extra") or {}))

    def differences(self, old: Fingerprint) -> list[str]:
        """What differs from an older fingerprint, in words: ``config rl.lr 0.0001 -> 0.0005``, ``input init``."""
        out = [f"config {k} {_short(a)} -> {_short(b)}" for k, a, b in _diff(old.config, self.config, "")]
        out += [f"input {name}" for name in sorted(set(old.inputs) | set(self.inputs))
                if old.inputs.get(name) != self.inputs.get(name)]
        if old.seed != self.seed:
            out.append(f"seed {old.seed} -> {self.seed}")
        out += [f"{k} {_short(a)} -> {_short(b)}" for k, a, b in _diff(old.extra, self.extra, "")]
        return out


def _diff(old: Any, new: Any, prefix: str) -> list[tuple[str, Any, Any]]:
    if isinstance(old, dict) and isinstance(new, dict):
        out = []
        for k in sorted(set(old) | set(new), key=str):
            out += _diff(old.get(k, _ABSENT), new.get(k, _ABSENT), f"{prefix}.{k}" if prefix else str(k))
        return out
    return [] if old == new else [(prefix or "<all>", old, new)]


def _short(value: Any, limit: int = 40) -> str:
    text = json.dumps(value, sort_keys=True) if value != _ABSENT else _ABSENT
    return text if len(text) <= limit else text[: limit - 3] + "..."


def fingerprint(
    config: Any,
    keys: Sequence[str],
    *,
    inputs: Mapping[str, str | Path] | None = None,
    seed: int | None = None,
    extra: Mapping[str, Any] | None = None,
) -> Fingerprint:
    """The fingerprint of a stage's work: its config slice (``keys``), its inputs' identities, its seed, extra. A
    stage's typed config is hashed as its plain data (`predict.config.models.plain_data`: the bytes of its slice)."""
    return Fingerprint(
        config=config_slice(plain_data(config), keys),
        inputs={name: input_identity(value) for name, value in sorted((inputs or {}).items())},
        seed=seed,
        extra=_canonical(dict(extra or {})),
    )


# ----------------------------------------------------------------------------------------------------------------
# Stored beside the state
# ----------------------------------------------------------------------------------------------------------------
def read_fingerprint(folder: str | Path) -> tuple[Fingerprint, bool] | None:
    """(fingerprint, finished) stored in a resumable folder, or None."""
    path = Path(folder) / FINGERPRINT_FILE
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None
    return Fingerprint.from_dict(data), bool(data.get("finished", False))


def write_fingerprint(folder: str | Path, fp: Fingerprint, *, finished: bool = False) -> Path:
    return write_json({**fp.to_dict(), "digest": fp.digest, "finished": finished}, Path(folder) / FINGERPRINT_FILE)


def mismatch(folder: str | Path, fp: Fingerprint) -> str | None:
    """None when the folder's state may be resumed under ``fp``; else why not, in a few words."""
    stored = read_fingerprint(folder)
    if stored is None:
        return "it records no fingerprint"
    old, finished = stored
    if finished:
        return "it is a finished run's (its outputs were removed or --forcerun asked for it again)"
    differences = fp.differences(old)
    return f"it was made from other inputs: {'; '.join(differences)}" if differences else None


def state_matches(folder: str | Path, fp: Fingerprint) -> bool:
    return mismatch(folder, fp) is None


def start_or_resume(folder: str | Path, fp: Fingerprint, *, what: str) -> bool:
    """True when ``folder`` holds state made under ``fp`` (resume it). Otherwise log one line saying why, empty the
    folder, store ``fp`` in it and return False (start fresh). A folder with nothing in it but perhaps its
    fingerprint is simply (re)started."""
    folder = Path(folder)
    contents = [p for p in folder.iterdir() if p.name != FINGERPRINT_FILE] if folder.is_dir() else []
    if contents:
        why = mismatch(folder, fp)
        if why is None:
            return True
        log.warning("%s: not resuming the state in %s: %s; starting fresh", what, folder, why)
        for p in contents:
            shutil.rmtree(p) if p.is_dir() and not p.is_symlink() else p.unlink()
    write_fingerprint(folder, fp)
    return False


def resumable_rows(out: str | Path, schema: pa.Schema, key: Sequence[str], fp: Fingerprint) -> ResumableParquet:
    """An output's persisted rows (`predict.outputs.ResumableParquet`), after dropping any persisted under another
    fingerprint: rows of other inputs or settings are redone, never resumed."""
    start_or_resume(ResumableParquet.partial_dir_of(out), fp, what=str(out))
    return ResumableParquet(out, schema, key)


def mark_finished(folder: str | Path) -> None:
    """The folder's work is published: a later run of the stage starts fresh (rule 4)."""
    stored = read_fingerprint(folder)
    if stored is not None:
        write_fingerprint(folder, stored[0], finished=True)


# ----------------------------------------------------------------------------------------------------------------
# Which run made results/
# ----------------------------------------------------------------------------------------------------------------
def claim_results_dir(config: Any, outputs: Iterable[str | Path]) -> None:
    """Refuse to write into ``results_dir`` when another ``run_name`` made it; record this run's name there on its
    first write. Only stages whose ``outputs`` lie under ``results_dir`` claim it (a stage run by hand into a
    scratch folder does not). `config`: a config mapping, or a typed object that holds both keys (the workflow's)."""
    from predict.stages import RESULTS_VIEW, stage_settings

    claim = stage_settings(RESULTS_VIEW, config) if isinstance(config, Mapping) else config
    results = Path(claim.results_dir).resolve()
    if not any(results == Path(p).resolve() or results in Path(p).resolve().parents for p in outputs if p):
        return
    marker = results / RUN_NAME_FILE
    name = claim.run_name
    if not marker.exists():
        results.mkdir(parents=True, exist_ok=True)
        tmp = marker.with_name(f"{RUN_NAME_FILE}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps({"run_name": name}) + "\n")
        try:
            os.link(tmp, marker)  # exclusive: of two runs starting at once, one claims the folder
        except FileExistsError:
            pass
        finally:
            tmp.unlink(missing_ok=True)
    try:
        owner = json.loads(marker.read_text())["run_name"]
    except (OSError, ValueError, KeyError, TypeError):
        raise ResultsDirError(f"{marker}: unreadable; it should say which run_name made {results}") from None
    if owner != name:
        raise ResultsDirError(
            f"{results} holds the results of run_name {owner!r}, not {name!r}: give this config its own "
            f"results_dir (e.g. results_dir: results/{name}), or remove {results} to start over"
        )


def run_fingerprint(
    config: Mapping[str, Any], stage: str, *, spec: Any, init: str | Path, tasks: str | Path, seed: int
) -> Fingerprint:
    """An RL or RFT run's fingerprint: the stage's config slice, its resolved run (`predict.runs.RunSpec`), the
    init checkpoint's and the task split's content, the seed."""
    return fingerprint(config, RESUME_KEYS[stage], inputs={"init": init, "tasks": tasks}, seed=seed,
                       extra={"run": asdict(spec)})
