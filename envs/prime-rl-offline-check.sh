#!/usr/bin/env bash
# prime-rl on ONE GPU of a node without network, through the project's own stages (issue 39; docs/prime-rl.md,
# "Seen on a GPU"): a check of the cluster path, not a result. After envs/prime-rl-offline-node.sh, from the
# checkout's root, one phase per call (each well inside 10 minutes):
#   data    (seconds; run by sft when TRACES is not given) `predict split` and `predict traces` of this config, then
#           the first two direct and two recovery traces of arm B (by task id) -> $R/data/traces-B-4.parquet, their
#           tasks -> tasks-4.parquet, and val.parquet: TRACES, TASKS and VAL's defaults
#   sft     a random Qwen3-0.6B shape (real tokenizer) -> `predict prime-rl-config sft` -> `predict prime-rl-train sft`
#   kill    `predict prime-rl-config rl` (Arm B, PredictAlgorithm) -> `predict prime-rl-train rl`, killed (SIGKILL, the
#           whole tree: a lost node) once step 2 has started
#   resume  the same `predict prime-rl-train rl` again: prime-rl resumes from its last checkpoint (ckpt.resume_step -1),
#           the job collects the steps, the per-step metrics and TensorBoard; then `predict evaluate` on val of the
#           last step through the pipeline's own vLLM server
# Inputs (env), defaults from `bash envs/install.sh --offline DIR` of a folder built with --prime-rl: PRL_SITE
# (prime-rl's site, .prime-rl/site), VLLM_SITE (vLLM 0.26's: .venv-vllm's site-packages), PIPE_SITE (the pipeline's:
# .venv's site-packages, in a path of their own: on top of vLLM's site they would also reach prime-rl, whose
# transformers 5.6.2 fails on the pipeline's kernels 0.19), SERVING_PYTHON (an interpreter that imports vLLM, for the
# pipeline's server: .venv-vllm/bin/python), TRACES (an SFT traces parquet of arm B), TASKS (the RL
# tasks parquet), VAL (the val split parquet): the three made by `data` unless given; R (where everything goes;
# default /tmp/prl-check), KILL_WAIT (seconds the kill phase waits for step 1 before it gives up; default 500).
# A random model writes no prediction and earns no reward, so every RL batch would be empty (prime-rl skips such a
# step and stops after 10): TRACES is a few traces and TASKS their own tasks, which SFT teaches it to write.
set -euo pipefail
phase="${1:?usage: envs/prime-rl-offline-check.sh data|sft|kill|resume}"
repo="$(cd "$(dirname "$0")/.." && pwd)"
purelib() { "$1" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])' 2>/dev/null; }
site="${PRL_SITE:-$repo/.prime-rl/site}"
vsite="${VLLM_SITE:-$(purelib "$repo/.venv-vllm/bin/python")}"
PIPE_SITE="${PIPE_SITE:-$(purelib "$repo/.venv/bin/python")}"
SERVING_PYTHON="${SERVING_PYTHON:-$repo/.venv-vllm/bin/python}"
R="${R:-/tmp/prl-check}"
mkdir -p "$R/logs"
export PATH="$site/bin:$PATH"
# tilelang (imported by prime-rl's model registry) loads TVM, which links libz3 from the z3-solver wheel
export LD_LIBRARY_PATH="$site/z3/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
prl_path="$site:$vsite:$repo/src"   # prime-rl's pins first (transformers 5.6.2, its verifiers)
pipe_path="${PIPE_SITE:?}:$vsite:$repo/src"   # the pipeline's own env
predict() { python3 -c "import sys; from predict.cli import main; sys.exit(main())" "$@"; }
cfg="$R/config.yaml"
if [ ! -f "$cfg" ]; then
  PYTHONPATH="$pipe_path" python3 - "$repo" "$cfg" "${SERVING_PYTHON:?}" <<'PY'
import sys
from pathlib import Path
import yaml
from predict.cli import merge_config_files
repo, out, python = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
config = merge_config_files(repo / "config" / "config.yaml", repo / "config" / "prime-rl-slice.yaml")
config["serving"]["python"] = python  # this node's vLLM interpreter
yaml.safe_dump(config, open(out, "w"))
PY
fi
od="$R/rl/B/seed42/prime-rl"
rl_train=(prime-rl-train rl --config "$cfg" --toml "$R/rl/B/seed42/prime-rl.toml" --dir "$R/cwd"
          --run-dir "$R/rl/B/seed42" --checkpoints-out "$R/rl/B/seed42/checkpoints.json"
          --tensorboard-dir "$R/tensorboard")
mkdir -p "$R/cwd"
stop_tree() {  # SIGKILL to the stage, prime-rl's launcher and every process it started (a lost node)
  pkill -KILL -f "predict.cli|prime_rl|$site/bin|vllm|torchrun" || true
}
peak=0
track_peak() {  # the largest device memory in use seen so far (MiB), every process on the GPU
  local now; now="$(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits | sort -n | tail -1)"
  (( now > peak )) && peak=$now || true
}

data="$R/data" data_traces="$R/data/traces-B-4.parquet" data_tasks="$R/data/tasks-4.parquet"  # what `data` writes
traces="${TRACES:-$data_traces}" tasks="${TASKS:-$data_tasks}" val="${VAL:-$data/val.parquet}"
case "$phase" in
data)
  # the pipeline's own stages on this config (MBPP ships in resources/): no parquet has to travel to the node
  PYTHONPATH="$pipe_path" predict split --config "$cfg" --out-dir "$data"
  PYTHONPATH="$pipe_path" predict traces --config "$cfg" --tasks-file "$data/sft.parquet" --out-dir "$R/traces"
  PYTHONPATH="$pipe_path" python3 - "$R/traces/B.parquet" "$data/sft.parquet" "$data_traces" "$data_tasks" <<'PY'
import sys
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
traces, sft, traces_out, tasks_out = pq.read_table(sys.argv[1]), pq.read_table(sys.argv[2]), *sys.argv[3:]
rows = sorted(traces.select(["task_id", "role"]).to_pylist(), key=lambda r: r["task_id"])
picked = [r["task_id"] for role in ("direct", "recovery") for r in [r for r in rows if r["role"] == role][:2]]
if len(picked) != 4:
    sys.exit(f"{sys.argv[1]}: wanted two direct and two recovery traces, found tasks {picked}")
pq.write_table(traces.filter(pc.is_in(traces["task_id"], value_set=pa.array(picked))), traces_out)
pq.write_table(sft.filter(pc.is_in(sft["task_id"], value_set=pa.array(picked))), tasks_out)
print(f"arm B's traces of tasks {picked} -> {traces_out}, their tasks -> {tasks_out}")
PY
  ;;
sft)
  [ -n "${TRACES:-}" ] || bash "$0" data
  # the pipeline's env imports what the last phase's evaluation needs, before 10 minutes go into SFT and RL (a
  # hand-picked wheel set once lacked verifiers v1's imports: envs/offline.py resolves them)
  PYTHONPATH="$pipe_path" python3 -c "import verifiers.v1, predict.env.runner, predict.evaluate" \
    || { echo "the pipeline's env on this node is incomplete (bash envs/install.sh --offline DIR)"; exit 1; }
  t0=$SECONDS
  PYTHONPATH="$prl_path" predict build-tiny-model --config "$cfg" --out-dir "$R/models/tiny"
  PYTHONPATH="$prl_path" predict prime-rl-config sft --config "$cfg" --arm B --traces "$traces" \
    --dataset-dir "$R/sft/B/prime-rl-data" --model "$R/models/tiny" --output-dir "$R/sft/B/prime-rl" \
    --out "$R/sft/B/prime-rl.toml"
  t1=$SECONDS
  PYTHONPATH="$prl_path" predict prime-rl-train sft --config "$cfg" --toml "$R/sft/B/prime-rl.toml" --dir "$R/cwd" \
    --checkpoint "$R/checkpoints/B/sft" --metrics-out "$R/sft/B/metrics.parquet"
  echo "phase sft: model + config $((t1 - t0)) s, prime-rl sft $((SECONDS - t1)) s"
  ;;
kill)
  PYTHONPATH="$prl_path" predict prime-rl-config rl --config "$cfg" --run B --seed 42 --tasks-file "$tasks" \
    --model "$R/checkpoints/B/sft" --output-dir "$od" --out "$R/rl/B/seed42/prime-rl.toml"
  t0=$SECONDS
  PYTHONPATH="$prl_path" setsid python3 -c "import sys; from predict.cli import main; sys.exit(main())" \
    "${rl_train[@]}" > "$R/logs/rl-attempt1.log" 2>&1 &
  # step 2 has started once step 1's checkpoint is complete (prime-rl writes STABLE last)
  until [ -f "$od/checkpoints/step_1/STABLE" ] || [ -f "$od/weights/step_1/STABLE" ]; do
    sleep 2; track_peak
    if ! pgrep -f "predict.cli.*prime-rl-train" >/dev/null; then echo "prime-rl-train exited before step 1"; tail -30 "$R/logs/rl-attempt1.log"; exit 1; fi
    if (( SECONDS - t0 > ${KILL_WAIT:-500} )); then echo "no step 1 after ${KILL_WAIT:-500} s"; stop_tree; exit 1; fi
  done
  sleep 8
  echo "phase kill: step 1 done after $((SECONDS - t0 - 8)) s; device peak so far ${peak} MiB; SIGKILL to the whole tree"
  stop_tree
  sleep 3
  ls "$od/checkpoints" "$od/weights" 2>&1 || true
  ;;
resume)
  t0=$SECONDS
  PYTHONPATH="$prl_path" predict "${rl_train[@]}" > "$R/logs/rl-attempt2.log" 2>&1 &
  pid=$!
  while kill -0 "$pid" 2>/dev/null; do sleep 2; track_peak; done
  wait "$pid" || { tail -50 "$R/logs/rl-attempt2.log"; exit 1; }
  echo "phase resume: prime-rl rl resumed and finished in $((SECONDS - t0)) s; device peak ${peak} MiB"
  last="$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['last'])" "$R/rl/B/seed42/checkpoints.json")"
  t1=$SECONDS
  PYTHONPATH="$pipe_path" predict evaluate --config "$cfg" --run B --split val --seed 42 --tasks-file "$val" \
    --checkpoint "step$last" --model "$R/rl/B/seed42/step$last" --out "$R/eval/val/B/seed42/step$last.parquet"
  echo "phase resume: val evaluation of step$last in $((SECONDS - t1)) s"
  ;;
*) echo "unknown phase $phase (data, sft, kill or resume)" >&2; exit 2 ;;
esac
