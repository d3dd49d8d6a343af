"""MBPP loading, validation and the seed-42 split: sizes, disjointness, stability, clear errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import types
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from predict.data import (
    MBPP_SCHEMA,
    SPLITS,
    MBPPFormatError,
    content_hash,
    load_mbpp,
    load_split,
    split_tasks,
    write_split,
)
from predict.outputs import write_rows

PAPER_SIZES = {"sft": 212, "rl": 212, "test": 500}
# The split of the shared MBPP file with seed 42, pinned: if any machine, Python or library version
# computes another split or another content hash, this fails (the manifest is the study's contract).
PINNED_SEED42_SHA256 = "d24d353b92a13f090ec16d9b4a1ae9cd963896a267e8a6c09d5b3cd5de1d5742"


def _write_jsonl(path: Path, rows: list) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def test_loads_all_974_tasks_sorted(mbpp_rows: list[dict]) -> None:
    assert len(mbpp_rows) == 974
    ids = [r["task_id"] for r in mbpp_rows]
    assert ids == sorted(ids) and len(set(ids)) == 974
    assert set(mbpp_rows[0]) == set(MBPP_SCHEMA.names)


def test_paper_split_sizes_disjoint_and_complete(mbpp_rows: list[dict]) -> None:
    splits = split_tasks(mbpp_rows, 42, PAPER_SIZES)
    sizes = {name: len(rows) for name, rows in splits.items()}
    assert sizes == {"sft": 212, "rl": 212, "val": 50, "test": 500}
    ids = {name: {r["task_id"] for r in rows} for name, rows in splits.items()}
    for a in SPLITS:
        for b in SPLITS:
            if a < b:
                assert not ids[a] & ids[b], f"{a} and {b} overlap"
    assert set().union(*ids.values()) == {r["task_id"] for r in mbpp_rows}


def test_split_depends_on_seed_only(mbpp_rows: list[dict]) -> None:
    a = split_tasks(mbpp_rows, 42, PAPER_SIZES)
    b = split_tasks(list(reversed(mbpp_rows)), 42, PAPER_SIZES)  # input order must not matter
    c = split_tasks(mbpp_rows, 43, PAPER_SIZES)
    assert all(content_hash(a[s]) == content_hash(b[s]) for s in SPLITS)
    assert content_hash(a["test"]) != content_hash(c["test"])


def test_manifest_matches_pinned_hash(mbpp_path: Path, mbpp_rows: list[dict], tmp_path: Path) -> None:
    manifest = write_split(
        split_tasks(mbpp_rows, 42, PAPER_SIZES), tmp_path, seed=42, source=str(mbpp_path), source_sha256=None
    )
    assert manifest["content_sha256"] == PINNED_SEED42_SHA256
    on_disk = json.loads((tmp_path / "manifest.json").read_text())
    assert on_disk["splits"]["val"]["count"] == 50
    # the parquet round-trips to exactly the rows that were hashed
    for name in SPLITS:
        assert content_hash(load_split(tmp_path / f"{name}.parquet")) == manifest["splits"][name]["content_sha256"]


def _split_slice(folder: Path, mbpp: Path, train: int, test: int, sha256: str | None = None) -> str:
    """`predict split`'s config slice (config data): this MBPP file, seed 42, `train` sft and rl tasks each."""
    data = {"mbpp_path": str(mbpp), "split_seed": 42, "sizes": {"sft": train, "rl": train, "test": test}}
    path = folder / "split-slice.json"
    path.write_text(json.dumps({"data": {**data, "mbpp_sha256": sha256} if sha256 else data}))
    return str(path)


def test_split_is_stable_across_processes_and_hash_seeds(mbpp_path: Path, tmp_path: Path) -> None:
    """Two fresh interpreters with different PYTHONHASHSEED write the same manifest."""
    manifests = []
    for hash_seed in ("0", "12345"):
        out = tmp_path / hash_seed
        env = {**os.environ, "PYTHONHASHSEED": hash_seed}
        cmd = [sys.executable, "-m", "predict.cli", "split", "--config-slice", _split_slice(tmp_path, mbpp_path, 212, 500),
               "--out-dir", str(out)]
        subprocess.run(cmd, check=True, env=env, capture_output=True)
        manifests.append(json.loads((out / "manifest.json").read_text()))
    assert manifests[0] == manifests[1]
    assert manifests[0]["content_sha256"] == PINNED_SEED42_SHA256


def test_parquet_source_gives_the_same_split(mbpp_rows: list[dict], tmp_path: Path) -> None:
    source = write_rows(mbpp_rows, MBPP_SCHEMA, tmp_path / "mbpp.parquet")
    rows = load_mbpp(source, hf_fallback=False)
    assert content_hash(rows) == content_hash(mbpp_rows)
    assert pq.read_table(source).num_rows == 974


@pytest.mark.parametrize(
    ("bad_row", "expected"),
    [
        ("{not json", r"row 2: not valid JSON"),
        ({"task_id": 7, "text": "t", "code": "c", "test_setup_code": "", "challenge_test_list": []},
         r"row 2: missing field 'test_list'"),
        ({"task_id": "7", "text": "t", "code": "c", "test_list": ["assert 1"], "test_setup_code": "",
          "challenge_test_list": []}, r"row 2: field 'task_id' must be an integer"),
        ({"task_id": 7, "text": "t", "code": "c", "test_list": "assert 1", "test_setup_code": "",
          "challenge_test_list": []}, r"row 2 \(task_id 7\): field 'test_list'"),
        ({"task_id": 7, "text": "", "code": "c", "test_list": ["assert 1"], "test_setup_code": "",
          "challenge_test_list": []}, r"row 2 \(task_id 7\): field 'text'"),
        ({"task_id": 7, "text": "t", "code": "c", "test_list": ["assert 1"], "test_setup_code": None,
          "challenge_test_list": []}, r"row 2 \(task_id 7\): field 'test_setup_code'"),
        ({"task_id": 1, "text": "t", "code": "c", "test_list": ["assert 1"], "test_setup_code": "",
          "challenge_test_list": []}, r"row 2: duplicate task_id 1 \(first at row 1\)"),
    ],
)
def test_malformed_row_names_row_and_field(
    mbpp_rows: list[dict], tmp_path: Path, bad_row: object, expected: str
) -> None:
    path = _write_jsonl(tmp_path / "mbpp.jsonl", [mbpp_rows[0], bad_row])
    with pytest.raises(MBPPFormatError, match=expected):
        load_mbpp(path, hf_fallback=False)


def test_missing_file_without_fallback_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="hf_fallback"):
        load_mbpp(tmp_path / "absent.jsonl", hf_fallback=False)


def test_hf_fallback_used_only_when_file_is_missing(
    mbpp_rows: list[dict], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = []

    def load_dataset(name: str, config: str) -> dict:
        calls.append((name, config))
        return {"test": mbpp_rows[:500], "train": mbpp_rows[500:]}

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=load_dataset))
    rows = load_mbpp(tmp_path / "absent.jsonl", hf_fallback=True)
    assert calls == [("mbpp", "full")]
    assert content_hash(rows) == content_hash(mbpp_rows)


def test_sizes_larger_than_mbpp_fail(mbpp_rows: list[dict]) -> None:
    with pytest.raises(ValueError, match="need 1000 tasks"):
        split_tasks(mbpp_rows, 42, {"sft": 500, "rl": 400, "test": 100})


def test_cli_reports_bad_input_without_traceback(tmp_path: Path, mbpp_rows: list[dict]) -> None:
    path = _write_jsonl(tmp_path / "mbpp.jsonl", [mbpp_rows[0], "{broken"])
    proc = subprocess.run(
        [sys.executable, "-m", "predict.cli", "split", "--config-slice", _split_slice(tmp_path, path, 1, 1),
         "--out-dir", str(tmp_path / "out")],
        capture_output=True, text=True,
    )
    assert proc.returncode == 2
    assert "row 2" in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "out").exists()


SHIPPED = Path(__file__).resolve().parents[1] / "resources" / "mbpp"


def test_mbpp_ships_with_its_licence_citation_and_pinned_hash() -> None:
    from predict.config import load_config
    from predict.data import file_sha256

    assert {"mbpp.jsonl", "LICENSE", "CITATION.bib"} <= {p.name for p in SHIPPED.iterdir()}
    assert "CC BY 4.0" in (SHIPPED / "LICENSE").read_text()
    assert "Program Synthesis with Large Language Models" in (SHIPPED / "CITATION.bib").read_text()
    for name in ("config.yaml", "local.yaml"):
        data = load_config(SHIPPED.parents[1] / "config" / name)["data"]
        assert data["mbpp_path"] == "resources/mbpp/mbpp.jsonl"
        assert data["mbpp_sha256"] == file_sha256(SHIPPED / "mbpp.jsonl")
    assert len(load_mbpp(SHIPPED / "mbpp.jsonl", hf_fallback=False, sha256=data["mbpp_sha256"])) == 974


def test_damaged_copy_fails_naming_file_and_both_hashes(tmp_path: Path) -> None:
    from predict.config import load_config
    from predict.data import MBPPChecksumError, file_sha256

    expected = load_config(SHIPPED.parents[1] / "config" / "local.yaml")["data"]["mbpp_sha256"]
    damaged = tmp_path / "mbpp.jsonl"
    damaged.write_bytes((SHIPPED / "mbpp.jsonl").read_bytes().replace(b"assert", b"assrt", 1))
    with pytest.raises(MBPPChecksumError) as info:
        load_mbpp(damaged, hf_fallback=False, sha256=expected)
    message = str(info.value)
    assert str(damaged) in message and expected in message and file_sha256(damaged) in message
    proc = subprocess.run(  # the stage: one line, no traceback, nothing written
        [sys.executable, "-m", "predict.cli", "split", "--config-slice", _split_slice(tmp_path, damaged, 1, 1, expected),
         "--out-dir", str(tmp_path / "out")],
        capture_output=True, text=True,
    )
    assert proc.returncode == 2, proc.stderr
    assert "sha256" in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "out").exists()
