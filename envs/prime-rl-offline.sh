#!/usr/bin/env bash
# prime-rl for a GPU node WITHOUT network (an air-gapped cluster node, the lent H200): build its runtime here, where
# PyPI and the vendored sources are, as a wheelhouse; install it there with envs/prime-rl-offline-node.sh.
# `predict prime-rl-setup` (clone + uv sync --locked) needs network; this is the same tree, patched the same way, its
# imports satisfied from wheels. Seen on an H200 on 2026-12-04 (docs/prime-rl.md, "Seen on a GPU").
#
# Usage: bash envs/prime-rl-offline.sh OUT [VENDOR]
#   OUT/prime-rl/   the prime-rl tree at the pin (VENDOR's tarballs), our patches applied (predict-algorithm, and
#                   torch-attention for prime_rl.attn flash_attention_2_torch: no flash-attn wheel needed)
#   OUT/all/        the wheels and source tarballs (with PART_MB set: OUT/part1/, OUT/part2/, ... of at most PART_MB
#                   MiB each instead, envs/parts.py):
#       prime-rl, prime-rl-configs and its pinned verifiers as wheels, plus what their imports need that the node's
#       image lacks (the list below), for CPython 3.12 manylinux x86_64; and torchtitan and dion as source tarballs
#       (*.tgz: prime-rl pins them to git commits, no wheel on PyPI). 134 MiB in all on 2026-12-05.
# The node's image must already hold torch 2.11 (prime-rl's pin), and vLLM 0.26 comes separately
# (../shared/tools/vllm-gpu/ or prime-rl's own wheel URL): neither is in OUT.
# Needs: python3.12 with pip (wheels are built from the trees), network to PyPI, git mirrors of torchtitan and dion
# (TORCHTITAN_GIT, DION_GIT: default the GitHub URLs).
set -euo pipefail
out="$(realpath -m "${1:?usage: envs/prime-rl-offline.sh OUT [VENDOR]}")"
here="$(cd "$(dirname "$0")/.." && pwd)"
vendor="${2:-$here/../shared/vendor}"
# a python3.12 that runs (a pyenv shim is on PATH even where its version is not selected)
py="${PREDICT_PYTHON312:-}"
for candidate in python3.12 "$HOME/.pyenv/versions/3.12.1/bin/python"; do
  [ -n "$py" ] && break
  "$candidate" -c "import sys; assert sys.version_info[:2] == (3, 12)" 2>/dev/null && py="$candidate"
done
[ -n "$py" ] || { echo "no python3.12 found: set PREDICT_PYTHON312" >&2; exit 2; }
rm -rf "$out/all" "$out"/part[0-9]*
mkdir -p "$out/all"

# 1. the tree, patched exactly as prime-rl-setup patches it
rm -rf "$out/prime-rl"
tar -xzf "$vendor/prime-rl-60bc2954.tar.gz" -C "$out"
tar -xzf "$vendor/verifiers-d30a3f48.tar.gz" -C "$out/prime-rl/deps"
(cd "$out/prime-rl" && git apply "$here/workflow/prime-rl/predict-algorithm.patch" \
  && git apply "$here/workflow/prime-rl/torch-attention.patch")
"$py" -m pip wheel -q --no-deps -w "$out/all" "$out/prime-rl" "$out/prime-rl/packages/prime-rl-configs" \
  "$out/prime-rl/deps/verifiers"

# 2. what prime-rl's sft, trainer, orchestrator and inference entry points import at start and the node's image
#    lacks (found by importing them against the image's package list), at prime-rl's uv.lock versions where PyPI has
#    them. prime-sandboxes 0.2.33 is prime-rl's pin (the pipeline's own env has 0.5.1): the two envs stay apart.
wheels=(
  aiolimiter==1.2.1 beartype==0.22.9 datasets==4.6.1 dill==0.4.1 multiprocess==0.70.18 docstring-parser==0.18.0
  flash-linear-attention==0.5.2 fla-core==0.5.2 loguru==0.7.3 modelexpress==0.3.0 orjson==3.11.9
  platformdirs==4.11.0 prime==0.6.19 prime-sandboxes==0.2.33 tilelang==0.1.9 toml==0.10.2 tomli==2.4.1
  tomli-w==1.2.0 torchao==0.17.0 torchdata==0.11.0 transformers==5.6.2 typeguard==4.5.2 tyro==1.0.13
  wandb==0.27.0 wandb-workspaces==0.4.3 z3-solver==4.15.4.0
  tokenizers==0.22.2   # transformers 5.6.2 refuses the image's 0.23.2
  compressed-tensors==0.17.0   # vLLM's MoE oracle imports it when prime-rl's inference server starts
  # prime-rl's verifiers, renderers and prime-pydantic-config and what they import: in sessions 2-4 on the H200 these
  # came with the pipeline's wheels in vLLM's site; with the pipeline's own set kept apart (its kernels 0.19 breaks
  # transformers 5.6.2's import) prime-rl stopped at "No module named 'renderers'" (2026-12-04, evening)
  aiocontextvars==0.2.2 anthropic==2.16.0 antlr4-python3-runtime==4.13.2 cffi==2.1.1 connectrpc==0.11.1 gepa==0.1.4
  httpcore2==2.16.2 httpx2==2.16.2 jsonschema==4.26.0 jsonschema-specifications==2025.9.1
  latex2sympy2-extended==1.11.0 math-verify==0.9.0 mcp==2.0.0 mcp-types==2.0.0 opentelemetry-api==1.45.2
  prime-pydantic-config==0.4.3 prime-runs==0.1.4 prime-traces==0.0.10 prime-tunnel==0.1.15 protobuf-py==0.1.1
  protobuf-py-ext==0.1.1 pycparser==3.12 pyjwt==2.15.1 pyqwest==0.12.0 python-multipart==0.0.34 referencing==0.37.0
  renderers==0.1.12 rpds-py==2026.9.1 sse-starlette==3.7.1 tenacity==9.2.1 truststore==0.10.5
)
"$py" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64 \
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64 \
  -d "$out/all" "${wheels[@]}"

# 3. the git-pinned trees (uv.lock: torchtitan 23e4dfc; dion d891eeb, or the closest commit a mirror has: prime-rl
#    only imports its Muon, which the study's AdamW never uses)
tree() {  # NAME URL REV PACKAGE_DIR [head: the mirror's HEAD stands in when REV is missing]
  local tmp rev="$3"; tmp="$(mktemp -d)"
  git clone -q --bare "$2" "$tmp/repo"
  if ! git --git-dir="$tmp/repo" cat-file -e "$rev^{commit}" 2>/dev/null; then
    [ "${5:-}" = head ] || { echo "$1: commit $rev is not in $2" >&2; exit 1; }
    echo "$1: commit $rev is not in $2, using its HEAD" >&2
    rev=HEAD
  fi
  # only the package folder: nothing else of the tree is needed (and a partial mirror may lack the rest's blobs)
  git --git-dir="$tmp/repo" archive --format=tar.gz -o "$out/all/$1.tgz" "$rev" "$4"
  rm -rf "$tmp"
}
tree torchtitan "${TORCHTITAN_GIT:-https://github.com/pytorch/torchtitan}" 23e4dfca5ca52587dbaf18f67bee8d73e875df5b torchtitan
tree dion "${DION_GIT:-https://github.com/samsja/dion.git}" d891eebbd950a6ff11d9b5f806282e33df83df9d dion head
if [ -n "${PART_MB:-}" ]; then
  "$py" "$here/envs/parts.py" "$out/all" "$out" "$PART_MB"
  echo "copy each $out/partN to the node, then there: bash envs/prime-rl-offline-node.sh SITE $out/part*"
else
  echo "copy $out to the node, then there: bash envs/prime-rl-offline-node.sh SITE $out/all"
fi
