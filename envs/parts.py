"""Pack a folder's files into parts of at most a given size, for a transport with a size limit per transfer.

    python3 envs/parts.py SRC OUT LIMIT_MB      # SRC/* -> OUT/part1, OUT/part2, ... ; SRC is removed

First fit, largest file first. A file larger than a part is an error naming it (envs/offline.py's `--part-mb` cuts
such files into pieces and joins them on the node). Used by envs/offline.py and envs/prime-rl-offline.sh (PART_MB).
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path


def pack(sizes: dict[str, int], limit: int) -> list[list[str]]:
    """Names grouped into parts of at most `limit` bytes each: first fit, largest first."""
    parts: list[list[str]] = []
    used: list[int] = []
    for name in sorted(sizes, key=lambda n: (-sizes[n], n)):
        size = sizes[name]
        if size > limit:
            raise ValueError(f"{name} is {size / 2**20:.1f} MiB, more than a part holds ({limit / 2**20:.0f} MiB)")
        for i, total in enumerate(used):
            if total + size <= limit:
                parts[i].append(name)
                used[i] += size
                break
        else:
            parts.append([name])
            used.append(size)
    return parts


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    src, out, limit = Path(argv[0]), Path(argv[1]), int(argv[2]) << 20
    files = {f.name: f.stat().st_size for f in sorted(src.iterdir()) if f.is_file()}
    try:
        parts = pack(files, limit)
    except ValueError as e:
        print(f"parts.py: {e}", file=sys.stderr)
        return 1
    for i, names in enumerate(parts, 1):
        (out / f"part{i}").mkdir(parents=True)
        for name in names:
            shutil.move(src / name, out / f"part{i}" / name)
        print(f"part{i}: {len(names)} files, {sum(files[n] for n in names) / 2**20:.1f} MiB")
    shutil.rmtree(src)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
