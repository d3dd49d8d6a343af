#!/usr/bin/env bash
# The pipeline's own runtime, as wheels, for a GPU node without network whose image already holds torch,
# transformers, pyarrow & co (docs/gpu.md; the vLLM GPU build comes separately, e.g. ../shared/tools/vllm-gpu/).
#   bash envs/pipeline-offline.sh OUT          # here, after envs/install.sh: OUT/part1, OUT/part2, ... (cp312)
#   python3 -m pip install --no-index --no-deps --target SITE OUT/part*/*.whl      # there, then PYTHONPATH=SITE:src
#   PYTHONPATH=SITE:src python3 -c 'import predict.env.runner, verifiers.v1, snakemake'   # there: fail fast
# What is carried: every distribution of the pipeline venv (.venv, the resolved closure of pyproject's deps) that the
# node lacks (NODE_PACKAGES, default envs/offline-node-image.txt) and a run imports (not the dev tools, wandb, or
# PuLP: Snakemake runs without it with --scheduler greedy), at the venv's versions. The few with no wheel on the
# index (connection_pool, appdirs: pure Python) are built here. Parts hold at most PART_MB (default 56) so that each
# fits a 64 MiB transfer. Why: a hand-picked set missed docstring_parser and prime_sandboxes (verifiers v1's imports)
# on the H200 on 2026-12-04, found only when the RL run's val evaluation started (docs/prime-rl.md).
set -euo pipefail
out="${1:?usage: envs/pipeline-offline.sh OUT}"
repo="$(cd "$(dirname "$0")/.." && pwd)"
py="$repo/.venv/bin/python"
node="${NODE_PACKAGES:-$repo/envs/offline-node-image.txt}"
skip="${SKIP:-predict ruff pytest pytest-timeout iniconfig pluggy wandb pulp pip setuptools}"
[ -x "$py" ] || { echo "no $py: run envs/install.sh first" >&2; exit 1; }
rm -rf "$out" && mkdir -p "$out/all"
plat=(--platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64
      --platform linux_x86_64)
# name==version of what the node lacks (names compared as PEP 503 normalises them)
"$py" - "$node" "$skip" > "$out/requirements.txt" <<'PY'
import re
import sys
from importlib.metadata import distributions

norm = lambda n: re.sub(r"[-_.]+", "-", n).lower()
have = {norm(l.split("==")[0].strip()) for l in open(sys.argv[1]) if l.strip() and not l.startswith("#")}
have |= {norm(n) for n in sys.argv[2].split()}
for d in sorted(distributions(), key=lambda d: norm(d.metadata["Name"])):
    if norm(d.metadata["Name"]) not in have:
        print(f"{d.metadata['Name']}=={d.version}")
PY
echo "$(wc -l < "$out/requirements.txt") distributions the node lacks"
while read -r req; do
  "$py" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp "${plat[@]}" \
    -d "$out/all" "$req" 2>/dev/null \
    || "$py" -m pip wheel -q --no-deps -w "$out/all" "$req" \
    || { echo "no wheel for $req, and it does not build here" >&2; exit 1; }
done < "$out/requirements.txt"
# into parts of at most PART_MB, largest first
"$py" "$repo/envs/parts.py" "$out/all" "$out" "${PART_MB:-56}"
