"""Atomic parquet writes and the resumable row sink that stages persist into."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from predict.outputs import ResumableParquet, write_rows

SCHEMA = pa.schema([("task_id", pa.int64()), ("sample", pa.int64()), ("reward", pa.float64())])


def test_write_rows_keeps_columns_of_an_empty_table(tmp_path: Path) -> None:
    path = write_rows([], SCHEMA, tmp_path / "empty.parquet")
    assert pq.read_table(path).schema.names == ["task_id", "sample", "reward"]
    assert not list(tmp_path.glob(".*.tmp")), "no temporary file is left behind"


def test_failed_write_leaves_no_output(tmp_path: Path) -> None:
    with pytest.raises((pa.ArrowInvalid, pa.ArrowTypeError, TypeError)):
        write_rows([{"task_id": "not an int", "sample": 0, "reward": 1.0}], SCHEMA, tmp_path / "x.parquet")
    assert list(tmp_path.iterdir()) == []


def test_resume_skips_persisted_rows_and_finishes_in_key_order(tmp_path: Path) -> None:
    out = tmp_path / "rollouts.parquet"
    first = ResumableParquet(out, SCHEMA, key=("task_id", "sample"))
    first.append([{"task_id": 3, "sample": 0, "reward": 1.0}])
    first.append([{"task_id": 1, "sample": 0, "reward": 0.0}])
    del first  # the stage "crashes" here: nothing is lost, no output exists yet
    assert not out.exists()

    second = ResumableParquet(out, SCHEMA, key=("task_id", "sample"))
    assert second.done() == {(3, 0), (1, 0)}
    second.append([{"task_id": 2, "sample": 0, "reward": 1.0}])
    second.finish()
    assert [r["task_id"] for r in pq.read_table(out).to_pylist()] == [1, 2, 3]
    assert not second.partial_dir.exists()


def test_resume_after_a_kill_mid_write_finishes_and_removes_the_folder(tmp_path: Path) -> None:
    # A job killed while writing a part leaves the part's temporary file (seen with scancel on SLURM).
    out = tmp_path / "rollouts.parquet"
    ResumableParquet(out, SCHEMA, key=("task_id",)).append([{"task_id": 1, "sample": 0, "reward": 1.0}])
    partial = out.with_name(out.name + ".partial")
    (partial / ".part-00001.parquet.k1ll3d.tmp").write_bytes(b"PAR1 half a part")

    again = ResumableParquet(out, SCHEMA, key=("task_id",))
    assert again.done() == {(1,)}
    again.append([{"task_id": 2, "sample": 0, "reward": 0.0}])
    again.finish()
    assert [r["task_id"] for r in pq.read_table(out).to_pylist()] == [1, 2]
    assert not partial.exists()


def test_partial_rows_of_another_schema_are_refused(tmp_path: Path) -> None:
    out = tmp_path / "rollouts.parquet"
    ResumableParquet(out, SCHEMA, key=("task_id",)).append([{"task_id": 1, "sample": 0, "reward": 1.0}])
    other = pa.schema([("task_id", pa.int64()), ("outcome", pa.string())])
    with pytest.raises(ValueError, match="differ"):
        ResumableParquet(out, other, key=("task_id",))


def test_outputs_get_the_umask_mode_not_mkstemps_0600(tmp_path: Path) -> None:
    import os
    import stat

    from predict.outputs import write_json

    old = os.umask(0o022)
    try:
        out = write_json({"a": 1}, tmp_path / "x.json")
    finally:
        os.umask(old)
    assert stat.S_IMODE(out.stat().st_mode) == 0o644
