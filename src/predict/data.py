"""MBPP: read, validate, split deterministically into sft / rl / val / test, and write the manifest.

The split is a pure function of the task ids and the seed: tasks are ordered by
sha256(f"{seed}:{task_id}") and cut into sft, rl and test; val takes the remainder. That ordering
does not depend on numpy/random versions, dict order or PYTHONHASHSEED, so the same file gives the
same split on every machine, and the manifest's content hashes prove it. So the test split is a fact of the
config's ``data`` section, not a record: `derive_test_split` computes it in any clone, with no registry and no
split file (`predict.campaign`'s seal and the test campaign read it from there, never from a file they are handed).
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.parquet as pq

from predict.outputs import write_json, write_rows

if TYPE_CHECKING:
    from predict.config.models import DataSettings, DataSizes

SPLITS: tuple[str, ...] = ("sft", "rl", "val", "test")

MBPP_SCHEMA = pa.schema(
    [
        ("task_id", pa.int64()),
        ("text", pa.string()),
        ("code", pa.string()),
        ("test_list", pa.list_(pa.string())),
        ("test_setup_code", pa.string()),
        ("challenge_test_list", pa.list_(pa.string())),
    ]
)
FIELDS: tuple[str, ...] = tuple(MBPP_SCHEMA.names)


class MBPPFormatError(ValueError):
    """A row of the MBPP source is malformed; the message names the file, the row and the field."""


class MBPPChecksumError(ValueError):
    """The MBPP file is not the pinned one (damaged, truncated or another version); names file and both hashes."""


def _is_str_list(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(v, str) for v in value)


def validate_row(row: Any, row_number: int, source: str) -> dict[str, Any]:
    """Check one MBPP row and return it with exactly the known fields. row_number is 1-based."""
    where = f"{source}: row {row_number}"
    if not isinstance(row, Mapping):
        raise MBPPFormatError(f"{where}: expected an object, got {type(row).__name__}")
    missing = [f for f in FIELDS if f not in row]
    if missing:
        raise MBPPFormatError(f"{where}: missing field {missing[0]!r}")
    task_id = row["task_id"]
    if isinstance(task_id, bool) or not isinstance(task_id, int):
        raise MBPPFormatError(f"{where}: field 'task_id' must be an integer, got {task_id!r}")
    where = f"{where} (task_id {task_id})"
    for field in ("text", "code"):
        if not isinstance(row[field], str) or not row[field].strip():
            raise MBPPFormatError(f"{where}: field {field!r} must be a non-empty string, got {row[field]!r:.60}")
    if not isinstance(row["test_setup_code"], str):
        raise MBPPFormatError(f"{where}: field 'test_setup_code' must be a string, got {row['test_setup_code']!r:.60}")
    if not _is_str_list(row["test_list"]) or not row["test_list"]:
        raise MBPPFormatError(f"{where}: field 'test_list' must be a non-empty list of strings")
    if not _is_str_list(row["challenge_test_list"]):
        raise MBPPFormatError(f"{where}: field 'challenge_test_list' must be a list of strings")
    return {f: row[f] for f in FIELDS}


def _read_raw(path: Path) -> list[Any]:
    if path.suffix == ".parquet":
        table = pq.read_table(path)
        return [dict(r, challenge_test_list=r.get("challenge_test_list") or []) for r in table.to_pylist()]
    rows: list[Any] = []
    with open(path, encoding="utf-8") as f:
        for line_number, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise MBPPFormatError(f"{path}: row {line_number}: not valid JSON ({e.msg})") from None
    return rows


def _load_hf() -> list[dict[str, Any]]:
    """All 974 tasks of the Hugging Face `mbpp` dataset (config `full`); needs network and `datasets`."""
    try:
        import datasets
    except ImportError:
        raise MBPPFormatError("MBPP file not found and the `datasets` package is missing for the HF fallback") from None
    dataset = datasets.load_dataset("mbpp", "full")
    return [dict(r) for name in sorted(dataset) for r in dataset[name]]


def load_mbpp(path: str | Path, *, hf_fallback: bool, sha256: str | None = None) -> list[dict[str, Any]]:
    """Read and validate MBPP from jsonl or parquet; sorted by task_id. Fails on the first bad row.

    ``hf_fallback`` (config data.hf_fallback): load the Hugging Face `mbpp` dataset when the file is missing.

    With ``sha256`` the file must hash to it (checked before anything is parsed); the Hugging Face fallback, used
    only when the file is missing, has no file to hash.
    """
    path = Path(path)
    if path.exists():
        if sha256 is not None and (actual := file_sha256(path)) != sha256.lower():
            raise MBPPChecksumError(
                f"{path}: sha256 is {actual}, expected {sha256.lower()} (data.mbpp_sha256): the MBPP copy is damaged "
                "or not the pinned file; restore it (git checkout -- resources/mbpp) or fix the config"
            )
        raw, source = _read_raw(path), str(path)
    elif hf_fallback:
        raw, source = _load_hf(), "hf:mbpp/full"
    else:
        raise FileNotFoundError(
            f"MBPP not found at {path} (the repository ships it as resources/mbpp/mbpp.jsonl; "
            "set data.hf_fallback: true to download it)"
        )
    rows = [validate_row(r, i, source) for i, r in enumerate(raw, start=1)]
    seen: dict[int, int] = {}
    for i, r in enumerate(rows, start=1):
        if r["task_id"] in seen:
            raise MBPPFormatError(f"{source}: row {i}: duplicate task_id {r['task_id']} (first at row {seen[r['task_id']]})")
        seen[r["task_id"]] = i
    return sorted(rows, key=lambda r: r["task_id"])


def split_tasks(rows: Sequence[Mapping[str, Any]], seed: int,
                sizes: DataSizes | Mapping[str, int]) -> dict[str, list[dict]]:
    """Cut the tasks into sft, rl, test (sizes given: the config's typed ``data.sizes``, or a mapping of the three
    counts read as one) and val (the remainder); each split sorted by task_id."""
    from predict.config.models import DataSizes

    if not isinstance(sizes, DataSizes):
        sizes = DataSizes.model_validate(dict(sizes))
    needed = sizes.sft + sizes.rl + sizes.test
    if needed > len(rows):
        raise ValueError(f"split sizes need {needed} tasks (sft+rl+test) but MBPP has only {len(rows)}")
    by_id = {r["task_id"]: dict(r) for r in rows}
    order = sorted(by_id, key=lambda t: hashlib.sha256(f"{seed}:{t}".encode()).hexdigest())
    end_sft, end_rl = sizes.sft, sizes.sft + sizes.rl
    cuts = {"sft": order[:end_sft], "rl": order[end_sft:end_rl], "test": order[end_rl:needed], "val": order[needed:]}
    return {name: [by_id[t] for t in sorted(cuts[name])] for name in SPLITS}


def content_hash(rows: Iterable[Mapping[str, Any]]) -> str:
    """sha256 over the canonical JSON of the rows (sorted keys, in task_id order)."""
    digest = hashlib.sha256()
    for row in sorted(rows, key=lambda r: r["task_id"]):
        digest.update(json.dumps({f: row[f] for f in FIELDS}, sort_keys=True, ensure_ascii=True).encode())
        digest.update(b"\n")
    return digest.hexdigest()


def file_sha256(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def write_split(
    splits: Mapping[str, Sequence[Mapping[str, Any]]],
    out_dir: str | Path,
    *,
    seed: int,
    source: str,
    source_sha256: str | None,
) -> dict[str, Any]:
    """Write {split}.parquet for every split plus manifest.json (counts, task ids and content hashes)."""
    out_dir = Path(out_dir)
    manifest: dict[str, Any] = {
        "seed": seed,
        "method": "sha256(f'{seed}:{task_id}') order; sft, rl, test cut in that order; val = remainder",
        "source": source,
        "source_sha256": source_sha256,
        "splits": {},
    }
    for name in SPLITS:
        rows = list(splits[name])
        write_rows(rows, MBPP_SCHEMA, out_dir / f"{name}.parquet")
        manifest["splits"][name] = {
            "count": len(rows),
            "content_sha256": content_hash(rows),
            "task_ids": [r["task_id"] for r in rows],
        }
    manifest["content_sha256"] = hashlib.sha256(
        "".join(manifest["splits"][n]["content_sha256"] for n in SPLITS).encode()
    ).hexdigest()
    write_json(manifest, out_dir / "manifest.json")
    return manifest


def load_split(path: str | Path) -> list[dict[str, Any]]:
    """Read one split parquet back as rows, checking it has the MBPP columns."""
    table = pq.read_table(path)
    missing = [f for f in FIELDS if f not in table.column_names]
    if missing:
        raise MBPPFormatError(f"{path}: missing column {missing[0]!r}")
    return table.select(list(FIELDS)).to_pylist()


@dataclass(frozen=True)
class TestSplit:
    """The test split a ``data`` section defines (`derive_test_split`): its rows in task_id order, their ids, and
    the content hash the test campaign is keyed on (`content_hash`, the manifest's ``splits.test.content_sha256``)."""

    __test__ = False  # not a pytest class

    rows: tuple[dict[str, Any], ...]
    task_ids: frozenset[int]
    sha256: str
    source: str  # the MBPP file (or hf:mbpp/full) it was cut from
    seed: int

    def describe(self) -> str:
        """In words, for a refusal: where the split comes from."""
        return f"the test split of {self.source} (split seed {self.seed}, {len(self.rows)} tasks)"


def mbpp_file(data: DataSettings) -> Path:
    """``data.mbpp_path`` as a stage finds it: from the working directory (the workflow runs in the repository),
    else from the repository root, which the config documents it as relative to."""
    path = Path(data.mbpp_path)
    if path.is_absolute() or path.exists():
        return path
    from predict.config import REPO_ROOT

    return path if not (REPO_ROOT / path).exists() else REPO_ROOT / path


def derive_test_split(data: DataSettings) -> TestSplit:
    """The test split of a config's typed ``data`` section (``mbpp_path`` checked against ``mbpp_sha256``,
    ``split_seed``, ``sizes``), cut exactly as `predict split` cuts it (`split_tasks`), with no registry and no split
    file: what every stage's seal and the test campaign (`predict.campaign`) hold task ids against. Cached per process
    by the file's identity (path, size, mtime, ctime, inode: a rewrite changes the ctime) and the settings."""
    path, sizes = mbpp_file(data), data.sizes
    try:
        st = path.stat()
        stamp: tuple[Any, ...] = (str(path.resolve()), st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino)
    except OSError:
        stamp = (str(path), None)  # missing: the HF fallback (load_mbpp says what is wrong otherwise)
    return _derive(stamp, str(path), data.hf_fallback, data.mbpp_sha256, data.split_seed,
                   (sizes.sft, sizes.rl, sizes.test))


@functools.lru_cache(maxsize=8)
def _derive(stamp: tuple[Any, ...], path: str, hf_fallback: bool, sha256: str | None, seed: int,
            sizes: tuple[int, int, int]) -> TestSplit:
    from predict.config.models import DataSizes

    del stamp  # the cache key only
    rows = load_mbpp(path, hf_fallback=hf_fallback, sha256=sha256)
    sft, rl, test_size = sizes  # the cache key's tuple
    test = split_tasks(rows, seed, DataSizes(sft=sft, rl=rl, test=test_size))["test"]
    source = path if os.path.exists(path) else "hf:mbpp/full"
    return TestSplit(tuple(test), frozenset(int(r["task_id"]) for r in test), content_hash(test), source, seed)


def task_ids_of(path: str | Path) -> list[int]:
    """The ``task_id`` column of a task-keyed parquet (a split, traces, rollouts), without reading the rest."""
    if "task_id" not in pq.read_schema(path).names:
        raise MBPPFormatError(f"{path}: no task_id column: not a file of tasks")
    return [int(t) for t in pq.read_table(path, columns=["task_id"]).column("task_id").to_pylist()]
