"""What trusting the hash cache by content costs (predict.fingerprint rule 5), side by side, interleaved:

* ``old_hit``: the cache as it was keyed before issue 38 (path, size, mtime, inode): one stat and one small read;
  fooled by a same-size rewrite with its old mtime restored.
* ``new_hit``: `predict.fingerprint.file_sha256` on a cached file (the key adds ctime and device): one more stat
  field, and one more stat after a miss's read (the file must not have changed while it was read).
* ``hash_on_read``: no cache, the sha256 of every byte on every call: what "hash on read" would cost.

Per file size, the median seconds of a call over interleaved rounds, and the ratios new_hit / old_hit and
hash_on_read / new_hit. The machine may be shared: ratios, not absolute times, are the result.

    PYTHONPATH=src python benchmarks/fingerprint_cache.py > benchmarks/fingerprint_cache.json
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

SIZES_MIB = (1, 64, 256)
ROUNDS = 7


def old_cached_sha256(path: Path, cache: Path) -> str:
    """The pre-issue-38 file_sha256, for the comparison (its key: real path, size, mtime, inode)."""
    real = path.resolve()
    st = real.stat()
    key = hashlib.sha256(f"{real}\0{st.st_size}\0{st.st_mtime_ns}\0{st.st_ino}".encode()).hexdigest()
    cached = cache / key[:2] / key
    try:
        digest = cached.read_text().strip()
        if len(digest) == 64:
            return digest
    except OSError:
        pass
    with open(real, "rb") as f:
        digest = hashlib.file_digest(f, "sha256").hexdigest()
    cached.parent.mkdir(parents=True, exist_ok=True)
    cached.write_text(digest)
    return digest


def hash_on_read(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def timed(fn, *args) -> float:
    t0 = time.perf_counter()
    fn(*args)
    return time.perf_counter() - t0


def main() -> None:
    from predict import fingerprint

    with tempfile.TemporaryDirectory(prefix="fingerprint-cache-") as tmp:
        root = Path(tmp)
        os.environ["PREDICT_HASH_CACHE"] = str(root / "new-cache")
        files = {}
        for mib in SIZES_MIB:
            path = root / f"input-{mib}MiB.bin"
            with open(path, "wb") as f:
                for _ in range(mib):
                    f.write(os.urandom(1 << 20))
            files[mib] = path
        # the new cache holds no digest of a file changed within RACY_NS of its read (rule 5)
        time.sleep(fingerprint.RACY_NS / 1e9 + 0.2)
        for path in files.values():  # warm both caches (and the page cache)
            assert old_cached_sha256(path, root / "old-cache") == fingerprint.file_sha256(path) == hash_on_read(path)
        rows = []
        for mib, path in files.items():
            times: dict[str, list[float]] = {"old_hit": [], "new_hit": [], "hash_on_read": []}
            for _ in range(ROUNDS):  # interleaved, so a neighbour's load falls on all three alike
                times["old_hit"].append(timed(old_cached_sha256, path, root / "old-cache"))
                times["new_hit"].append(timed(fingerprint.file_sha256, path))
                times["hash_on_read"].append(timed(hash_on_read, path))
            med = {k: statistics.median(v) for k, v in times.items()}
            rows.append({"size_mib": mib, **{f"{k}_s": v for k, v in med.items()},
                         "new_hit_over_old_hit": med["new_hit"] / med["old_hit"],
                         "hash_on_read_over_new_hit": med["hash_on_read"] / med["new_hit"]})
    out = {
        "what": "seconds per call (median of interleaved rounds) of a cached sha256: keyed as before issue 38, keyed "
                "with ctime (predict.fingerprint.file_sha256), and no cache (hash on every read)",
        "rounds": ROUNDS,
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, shared with other work (ratios, not times)",
        "python": sys.version.split()[0],
        "date": time.strftime("%F"),
        "rows": rows,
    }
    json.dump(out, sys.stdout, indent=1)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
