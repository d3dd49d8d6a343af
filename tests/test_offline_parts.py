"""envs/parts.py: an offline folder's files (envs/offline.py, envs/prime-rl-offline.sh) packed into parts that each fit
a transport with a size limit per transfer. On 2026-12-05 prime-rl's 134 MiB of wheels and trees came as two folders
that had to be split by hand."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from .conftest import REPO

PARTS = REPO / "envs" / "parts.py"
MIB = 1 << 20


def _files(folder: Path, sizes_mib: dict[str, float]) -> None:
    folder.mkdir(parents=True)
    for name, mib in sizes_mib.items():
        with open(folder / name, "wb") as f:  # sparse: the size is what counts, not the bytes on disk
            f.truncate(int(mib * MIB))


def test_parts_fit_the_limit_and_carry_every_file_once(tmp_path: Path) -> None:
    sizes = {
        "tilelang.whl": 42.3,
        "z3.whl": 27.9,
        "wandb.whl": 26.0,
        "transformers.whl": 9.9,
        "torchtitan.tgz": 2.9,
        "dion.tgz": 0.2,
        "prime_rl.whl": 0.5,
    }
    _files(tmp_path / "all", sizes)
    result = subprocess.run([sys.executable, str(PARTS), str(tmp_path / "all"), str(tmp_path), "60"],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    parts = sorted(p for p in tmp_path.iterdir() if p.name.startswith("part"))
    carried = [f.name for p in parts for f in p.iterdir()]
    assert sorted(carried) == sorted(sizes)  # every file, once
    for p in parts:
        assert sum(f.stat().st_size for f in p.iterdir()) <= 60 * MIB, p.name
    assert len(parts) == 2  # 109.7 MiB: two parts, not one per big wheel
    assert not (tmp_path / "all").exists()
    assert "part1:" in result.stdout and "part2:" in result.stdout


def test_a_file_larger_than_a_part_is_refused_by_name(tmp_path: Path) -> None:
    _files(tmp_path / "all", {"huge.whl": 61, "small.whl": 1})
    result = subprocess.run([sys.executable, str(PARTS), str(tmp_path / "all"), str(tmp_path), "60"],
                            capture_output=True, text=True)
    assert result.returncode == 1
    assert "huge.whl" in result.stderr and "61.0 MiB" in result.stderr
    assert sorted(os.listdir(tmp_path / "all")) == ["huge.whl", "small.whl"]  # nothing moved


def test_both_offline_builders_pack_with_it() -> None:
    assert "envs/parts.py" in (REPO / "envs" / "prime-rl-offline.sh").read_text()
    assert "from parts import pack" in (REPO / "envs" / "offline.py").read_text()
