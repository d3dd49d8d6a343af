"""Derive the plan's per-unit figures, one file per device kind, from the measured JSON in benchmarks/.

    .venv/bin/python benchmarks/calibrate.py        # -> benchmarks/calibration/{cpu,h100,h200}.json

No figure is typed in here: each comes from a named file and field, with how it was derived (`predict.plan`'s
calibration rules). What no file gives yet is written down as missing, with what would give it; re-run this
script once that file lands (`benchmarks/rehearsal_<card>.json`, the 4B rehearsal: the rollout at the paper's reply
length, HF and state saves, the evaluation at 4B) and the figures fill in.

The sources:

* cpu: every ``plan_measured_cpu_*.json`` but those ``--hold-out`` names (benchmarks/plan_check.py measure: the
  embedded default run on the 2-core box), pooled: each figure a median or a fit over the jobs of all of them.
  Its figures are per job as the local profile ran it (two jobs beside one shared vLLM server, other work on the
  machine), waits for the server's lease and the machine's load included: they price that profile on that box.
* h200: ``gpu_slice_h200.json`` (the GPU slice's per-job wall times and device peaks, transcribed from
  benchmarks/log/gpu.md), ``rl_step_h200_inplace_sync.json`` and ``rl_step_h200_vllm.json`` (the 4B RL step),
  ``sft_speed_h200_int32.json`` (4B SFT), ``rehearsal_h200.json`` when it exists.
* h200 and h100, each: ``plan_measured_<card>_slice_*.json`` when there are any (the GPU slice's runs, measured by
  benchmarks/plan_check.py, pooled like the CPU's and after the rehearsal's figures; ``--hold-out`` applies).
* h100: ``rl_step_h100_sync_orders.json`` (the 4B RL step), ``eval_repeat_h100_cold_warm.json`` (the slice's server
  start), ``rehearsal_h100.json`` (the 4B rehearsal evaluating on vLLM's own kernels) and, first where both
  give a figure, ``rehearsal_h100_triton.json`` (the same on the design's ``TRITON_ATTN``), each when it exists.
* workload (any device): what the runs above measured of the study's data, traces and trainer state, and
  ``trace_tokens.json`` (benchmarks/trace_tokens.py: tokens per trace of the runs with traces of their own that no
  run above trained on).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
BENCH = REPO / "benchmarks"
sys.path.insert(0, str(REPO / "src"))

from predict.plan.calibration import holds_at  # noqa: E402
from predict.plan.costs import (  # noqa: E402
    TARGET_RULES,
    checkpointing,
    evaluation_timed_at,
    family,
    model_facts,
    server_key,
)
from predict.runs import checkpoint_steps  # noqa: E402
from predict.train.disk import (  # noqa: E402
    STATE_BYTES_PER_PARAM,
    checkpoint_bytes,
    rl_state_saves,
    rl_states_link_checkpoints,
    state_bytes,
)

# Figures of the work itself, not of the device: tokens per SFT trace (the real Qwen3 tokenizer), the bytes the data
# and statistics stages write, an HF folder's files beside its weights, the trainer state's bytes per parameter.
WORKLOAD = ("sft_tokens_per_trace", "output_bytes", "checkpoint_extra_bytes", "checkpoint_bytes_per_param",
            "state_bytes_per_param")
REHEARSAL_MISSING = "the 4B rehearsal gives it: benchmarks/rehearsal_{card}.json (config/gpu-rehearsal.yaml)"


def source_files(source: str) -> list[str]:
    """The files an entry's source names: `a.json+b.json: field` (runs pooled) names both."""
    return source.split(":")[0].split("+")


class Figures:
    def __init__(self) -> None:
        self.figures: dict[str, list[dict[str, Any]]] = {}
        self.sources: set[str] = set()

    def add(self, name: str, value: float | None, unit: str, source: str, how: str, *, first: bool = False,
            **at: Any) -> None:
        """`first`: before the entries already there (the plan takes the first whose conditions match): the study's
        own jobs, as the rehearsal ran them, before a benchmark of one part."""
        entry = {"value": None if value is None else round(float(value), 6), "unit": unit, "at": at,
                 "source": source, "how": how}
        entries = self.figures.setdefault(name, [])
        entries.insert(0, entry) if first else entries.append(entry)
        self.sources.update(source_files(source))

    def has(self, name: str, **at: Any) -> bool:
        """A measured `name`, at conditions that all hold in `at` where `at` is given (as the plan looks it up)."""
        return any(e.get("value") is not None and (not at or holds_at(e["at"], at)) for e in self.figures.get(name, []))

    def missing(self, name: str, why: str, **at: Any) -> None:
        self.figures.setdefault(name, []).append({"value": None, "at": at, "missing": why})

    def write(self, kind: str, device: str, cores: int) -> Path:
        out = BENCH / "calibration" / f"{kind}.json"
        out.parent.mkdir(exist_ok=True)
        body = {"kind": kind, "device": device, "cores": cores, "derived_by": "benchmarks/calibrate.py",
                "sources": sorted(self.sources), "figures": self.figures}
        out.write_text(json.dumps(body, indent=1) + "\n")
        return out


def _load(name: str) -> dict[str, Any] | None:
    path = BENCH / name
    return json.loads(path.read_text()) if path.is_file() else None


def _median(values: Iterable[float]) -> float:
    return statistics.median(list(values))


def _fit(points: list[tuple[float, float]]) -> tuple[float, float]:
    """Least squares y = a + b x; with one distinct x, a = 0 and b the mean ratio."""
    xs = {x for x, _ in points}
    if len(xs) < 2:
        return 0.0, sum(y for _, y in points) / sum(x for x, _ in points)
    n, sx, sy = len(points), sum(x for x, _ in points), sum(y for _, y in points)
    sxx, sxy = sum(x * x for x, _ in points), sum(x * y for x, y in points)
    b = (n * sxy - sx * sy) / (n * sxx - sx * sx)
    return (sy - b * sx) / n, b


def _server_load_figures(f: Figures, jobs: list[dict[str, Any]], src: str, *, first: bool, serving: dict[str, Any],
                         **at: Any) -> None:
    """serving_start_s and serving_reload_s: the medians of the shared-server loads the job logs noted. A start is
    labelled with the server it started (`predict.plan.costs.server_key` of the run's `serving`: the batch-invariant
    evaluation server's deterministic compile takes longer; on the CPU every job leases the default one)."""
    starts: dict[str, list[float]] = {}
    for j in jobs:
        if j.get("server") == "start":
            starts.setdefault(server_key(family(_rule_of(j)), serving), []).append(j["load_s"])
    for key, seen in sorted(starts.items()):
        f.add("serving_start_s", _median(seen), "s", f"{src}: jobs[].load_s",
              f"median of {len(seen)} shared-server start(s) of the {key} server the job logs noted", first=first,
              **at, server=key)
    seen = [j["load_s"] for j in jobs if j.get("server") == "reload"]
    if seen:
        f.add("serving_reload_s", _median(seen), "s", f"{src}: jobs[].load_s",
              f"median of {len(seen)} shared-server reload(s) the job logs noted", first=first, **at)


def _rule_of(job: dict[str, Any]) -> str:
    """A measured job's rule: a plan_measured row names it (`rule`), a rehearsal's row only its path (`job`)."""
    return job.get("rule") or job["job"].split("/")[0]


def _eval_figures(f: Figures, points: list[tuple[float, float]], output_bytes: float, src: str, *, first: bool,
                  at: dict[str, Any], serving: dict[str, Any]) -> None:
    """An evaluation job's cost: (wall - server start or reload) = fixed + episodes x per episode, fitted over the
    (episodes, seconds) points of every evaluation job, at the attention kernels the run's evaluation server ran
    (`serving`: the run's serving section), and its tables' bytes per episode (the same on any kernels)."""
    fixed, per_episode = _fit(points)
    how = (f"least squares over {len(points)} evaluation jobs: wall - server start or reload = fixed + episodes x "
           "per episode")
    timed_at = evaluation_timed_at(at, serving)
    f.add("eval_job_fixed_s", fixed, "s", f"{src}: jobs[evaluate*].wall_s, load_s, episodes", how, first=first,
          **timed_at)
    f.add("eval_episode_s", per_episode, "s/episode", f"{src}: jobs[evaluate*].wall_s, load_s, episodes", how,
          first=first, **timed_at)
    f.add("eval_bytes_per_episode", output_bytes / sum(e for e, _ in points), "bytes",
          f"{src}: jobs[evaluate*].output_bytes, episodes", "evaluation bytes / episodes", first=first, **at)


# --- the CPU: the embedded default, measured ------------------------------------------------------------------------
def pooled_runs(names: list[str]) -> dict[str, Any]:
    """Several measured runs of one config as one: their jobs side by side (each figure below is a median or a fit
    over all of them, so one slow run, for instance with other work on the box, moves it less), the largest RL state
    any of them saw. Runs of different configs or profiles are not one workload: refused, naming the odd file."""
    runs = [(name, _load(name)) for name in names]
    first_name, first = runs[0]
    for name, m in runs[1:]:
        for key in ("config", "profile", "device"):
            if m[key] != first[key]:
                raise SystemExit(f"{name}: {key} {m[key]!r} differs from {first_name}'s {first[key]!r}: "
                                 "calibrate from runs of one config, profile and device")
    states = [m["rl_state_bytes_max"] for _, m in runs if m.get("rl_state_bytes_max")]
    return {**first, "jobs": [j for _, m in runs for j in m["jobs"]], "rl_state_bytes_max": max(states, default=None)}


def cpu(measured_names: list[str]) -> Figures:
    f = Figures()
    measured_run_figures(f, measured_names)
    return f


def measured_run_figures(f: Figures, measured_names: list[str]) -> None:
    """The figures of runs of the workflow itself, measured by benchmarks/plan_check.py (one config, pooled: each
    figure a median or a fit over their jobs). On a GPU run, also each GPU rule's device peak, and each server start
    labelled with the server it started (the batch-invariant evaluation server's or the RL one's)."""
    from predict.plan.calibration import Calibration
    from predict.plan.command import load_study
    from predict.plan.costs import Pricer
    from predict.runs import resolve_run

    m = pooled_runs(measured_names)
    src = "+".join(measured_names)
    config = load_study([REPO / c for c in m["config"]])
    model = model_facts(config, REPO)
    pricer = Pricer(config, Calibration(m["device"], "", 0, {}), REPO)
    gpu = pricer.device == "gpu"
    jobs = [j for j in m["jobs"] if j.get("wall_s") is not None]
    by_family: dict[str, list[dict[str, Any]]] = {}
    for j in jobs:
        by_family.setdefault(family(j["rule"]), []).append(j)
    serving_families = {"evaluate", "evaluate_test", "rl", "rft", "rollout"}
    for fam, js in by_family.items():
        f.add("host_peak_mib", max(j["max_rss_mib"] for j in js), "MiB", f"{src}: jobs[].max_rss_mib",
              f"the largest peak RSS of the {len(js)} {fam} job(s)", family=fam, shape=model.shape)
        if fam in serving_families or fam == "train_sft":
            continue
        at = {"rule": fam, **({"shape": model.shape} if fam == "build_tiny_model" else {})}
        f.add("job_s", _median(j["wall_s"] for j in js), "s", f"{src}: jobs[].wall_s",
              f"median of the {len(js)} {fam} job(s)' wall time", **at)
        if fam != "build_tiny_model":
            f.add("output_bytes", _median(j["output_bytes"] for j in js), "bytes", f"{src}: jobs[].output_bytes",
                  f"median bytes of the {fam} job(s)' outputs", rule=fam)
    _server_load_figures(f, jobs, src, first=False, serving=config["serving"], shape=model.shape)
    if gpu:
        peaks = {fam: [(j["device_peak_gib"], j["job"], j["wildcards"].get("run") or j["wildcards"].get("arm"))
                       for j in js if j.get("gpus") and j.get("device_peak_gib")]
                 for fam, js in by_family.items()}
        _device_peak_figures(f, peaks, config, src, first=False, shape=model.shape)
    # evaluation: (wall - load) = fixed + episodes x per episode, fitted over every evaluation job
    ev = by_family.get("evaluate", []) + by_family.get("evaluate_test", [])
    if ev:
        pts = []
        for j in ev:
            split = "test" if family(j["rule"]) == "evaluate_test" else "val"
            episodes = (j["checkpoints"] or len(j["outputs"])) * pricer.eval_tasks(split)
            pts.append((episodes, j["wall_s"] - (j.get("load_s") or 0)))
        _eval_figures(f, pts, sum(j["output_bytes"] for j in ev), src, first=False,
                      at=pricer.serving_at(int(config["evaluation"]["max_tokens"])), serving=config["serving"])
    # RL: the steady steps (after the first, which warms the server and the trainer up) give the per-unit figures;
    # what a job takes beyond its steps at those rates is its fixed part
    rl_jobs = by_family.get("rl", [])
    if rl_jobs:
        rl = config["rl"]
        every = [s for j in rl_jobs for s in j["steps"]]
        # a run of one step a job (a rehearsal's cut) has only its first: then that, warm-up and all (an upper bound)
        steady = [s for s in every if s["step"] > 1] or every
        after = "after the first" if len(steady) < len(every) else "(each job's only one, warm-up included)"
        at = pricer.serving_at(pricer._rl_tokens())
        ep_s = sum(s["rollout_s"] for s in steady) / sum(s["n_rollouts"] for s in steady)
        tok = sum(s["n_tokens"] for s in every) / sum(s["n_rollouts"] for s in every)
        rate = sum(s["n_tokens"] for s in steady) / sum(s["update_s"] for s in steady)
        parts = ("samples_s", "sample_s", "sleep_s", "sync_s", "offload_s")
        other = statistics.mean(sum(s.get(k) or 0 for k in parts) for s in steady)
        saves = rl_state_saves(int(rl["steps"]), 0, int(rl["state_every"]),
                               checkpoint_steps(int(rl["steps"]), int(rl["checkpoint_every"])))
        save_wait = sum(s.get("save_s") or 0 for s in every) / (saves * len(rl_jobs))
        src_steps = f"{src}: jobs[rl].steps[]"
        f.add("rl_rollout_episode_s", ep_s, "s/episode", src_steps,
              f"rollout_s / n_rollouts over the steps {after}", **at)
        f.add("rl_tokens_per_episode", tok, "tokens", src_steps, "n_tokens / n_rollouts over every step", **at)
        f.add("rl_update_tokens_per_s", rate, "tokens/s", src_steps,
              f"n_tokens / update_s over the steps {after}",
              shape=model.shape, dtype=rl["dtype"], micro_batch_tokens=rl["micro_batch_tokens"],
              activation_checkpointing=checkpointing(rl["activation_checkpointing"],
                                                     rl.get("activation_checkpointing_layers")))
        f.add("rl_sleep_sync_s", other, "s/step", src_steps, f"samples + sleep + sync per step {after}",
              shape=model.shape)
        f.add("rl_save_wait_s", save_wait, "s/save", src_steps,
              f"save_s over every step / the {saves} saves a run makes (predict.train.disk.rl_state_saves)",
              shape=model.shape, dtype=rl["dtype"])
        per_step = ep_s * rl["tasks_per_step"] * rl["group_size"] * (1 + tok / rate / ep_s) + other
        fixed = _median(j["wall_s"] - (j.get("load_s") or 0) - rl["steps"] * per_step - saves * save_wait
                        for j in rl_jobs)
        f.add("rl_job_fixed_s", fixed, "s", f"{src}: jobs[rl].wall_s, load_s",
              f"median over {len(rl_jobs)} RL jobs of wall - server load - steps at the rates above", shape=model.shape)
        if m.get("rl_state_bytes_max") and model.params:
            f.add("state_bytes_per_param", m["rl_state_bytes_max"] / model.params, "bytes/param",
                  f"{src}: rl_state_bytes_max", "the largest .work/state seen while RL ran / parameters",
                  dtype=rl["dtype"])
    if by_family.get("rft"):
        rl, rft = config["rl"], config.get("rft") or {}
        at = {**pricer.serving_at(pricer._rl_tokens()), "steps": int(rl["steps"]), "tasks": rft.get("tasks"),
              "group_size": rft.get("group_size") or rl["group_size"]}
        f.add("rft_job_s", _median(x["wall_s"] - (x.get("load_s") or 0) for x in by_family["rft"]), "s",
              f"{src}: jobs[rft].wall_s, load_s", "median wall - server load of the RFT jobs (at these counts only)",
              **at)
    sft_jobs = by_family.get("train_sft", [])
    if sft_jobs:
        sft, traces = config["sft"], config["traces"]
        # every step: plan_check keeps each job's totals, so the first steps' warm-up (on a GPU, the kernels'
        # compile) is in the rate here, where a rehearsal's JSON leaves it to the fixed part; the job's sum holds
        rate = sum(j["sft"]["tokens"] for j in sft_jobs) / sum(j["sft"]["train_s"] for j in sft_jobs)
        at = {"shape": model.shape, "dtype": sft["dtype"], "device": pricer._sft_device()}
        f.add("sft_tokens_per_s", rate, "tokens/s", f"{src}: jobs[train_sft].sft",
              "tokens / training seconds, both arms (side by side, one thread each)", **at)
        f.add("sft_job_fixed_s", _median(j["wall_s"] - j["sft"]["tokens"] / rate for j in sft_jobs), "s",
              f"{src}: jobs[train_sft]", "median of wall - tokens at that rate", **at)
        n_traces = traces["n_direct"] + traces["n_recovery"]
        for arm in sorted({j["wildcards"]["arm"] for j in sft_jobs}):  # the same traces in every run: one figure
            j = next(j for j in sft_jobs if j["wildcards"]["arm"] == arm)
            run = resolve_run(config, arm)
            f.add("sft_tokens_per_trace", j["sft"]["tokens"] / (j["sft"]["epochs"] * n_traces), "tokens",
                  f"{src}: jobs[train_sft].sft.tokens", f"tokens / (epochs x {n_traces} traces), run "
                  f"{j['wildcards']['arm']}", protocol=run.protocol, variant=run.variant,
                  recovery_style=traces["recovery_style"], mix=str(traces["mix"]))
        per_param = _median(j["checkpoint_weights_bytes"] for j in sft_jobs) / model.params
        f.add("checkpoint_bytes_per_param", per_param, "bytes/param",
              f"{src}: jobs[train_sft].checkpoint_weights_bytes",
              f"an SFT checkpoint's safetensors / {model.params:,} parameters (saved bf16 whatever the training dtype)")
        extra = _median(j["checkpoint_bytes"] - j["checkpoint_weights_bytes"] for j in sft_jobs)
        f.add("checkpoint_extra_bytes", extra, "bytes", f"{src}: jobs[train_sft].checkpoint_bytes",
              "an HF checkpoint folder's bytes beside its safetensors (tokenizer, configs)")


# --- the GPUs ----------------------------------------------------------------------------------------------------
def rl_step_figures(f: Figures, name: str, variant: dict[str, Any], shape: str, server_start: float | None) -> None:
    rows = [r for r in variant["rows"] if not r.get("warmup")]
    rate = sum(r["n_tokens"] for r in rows) / sum(r["update_s"] for r in rows)
    at = {"shape": shape, "dtype": "bfloat16", "micro_batch_tokens": variant["micro_batch_tokens"],
          "activation_checkpointing": checkpointing(variant["activation_checkpointing"],
                                                    variant.get("activation_checkpointing_layers"))}
    f.add("rl_update_tokens_per_s", rate, "tokens/s", f"{name}: rows[].n_tokens, update_s",
          "tokens / update seconds over the timed steps", **at)
    f.add("rl_sleep_sync_s", statistics.mean((r.get("sleep_s") or 0) + (r.get("sync_memory_s") or 0)
                                             + (r.get("samples_s") or 0) + (r.get("offload_s") or 0) for r in rows),
          "s/step", f"{name}: rows[].sleep_s, sync_memory_s, samples_s, offload_s", "mean over the timed steps",
          shape=shape)
    f.add("device_peak_gib", variant["device_peak_gib"], "GiB", f"{name}: device_peak_gib",
          "the benchmark's device-wide peak (NVML)", family="rl", **{k: v for k, v in at.items() if k != "dtype"})
    if server_start:
        f.add("serving_start_s", server_start, "s", f"{name}: server_start_s", "vLLM's start on the 4B shape, "
              "the RL server (not batch-invariant)", shape=shape, server="default")


def gpu_missing(f: Figures, card: str, config: dict[str, Any]) -> None:
    """The 4B figures only a rehearsal (or the study itself) gives, where none has: written down as missing."""
    why = REHEARSAL_MISSING.format(card=card)
    env, rl, ev = config["env"], config["rl"], config["evaluation"]
    serving = {"shape": "qwen3-4b", "concurrency": env["concurrency"]}
    gaps = {"rl_rollout_episode_s": (why, {"max_tokens": rl.get("max_tokens") or env["max_tokens"], **serving}),
            "rl_tokens_per_episode": (why, {"max_tokens": rl.get("max_tokens") or env["max_tokens"], **serving}),
            "eval_episode_s": (why + " (its `all` phase: the evaluations)", {"max_tokens": ev["max_tokens"],
                                                                              **serving}),
            "rl_save_wait_s": (why + " (the step's wait for its saves)", {"shape": "qwen3-4b"}),
            "rl_job_fixed_s": (why + " (the trainer's load, the last save's writing)", {"shape": "qwen3-4b"}),
            "serving_reload_s": (why + " (a shared server reloaded with the next job's checkpoint)",
                                 {"shape": "qwen3-4b"}),
            "sft_tokens_per_s": (why + " (its SFT steps)", {"shape": "qwen3-4b"}),
            "sft_job_fixed_s": (why + " (the 4B load and HF save)", {"shape": "qwen3-4b"})}
    for name, (reason, at) in gaps.items():
        if not f.has(name):
            f.missing(name, reason, **at)
    # an evaluation on the design's attention kernels: measured on other kernels (the rehearsals before the design
    # chose TRITON_ATTN) it is not this evaluation's time
    kernels = evaluation_timed_at({**serving, "max_tokens": ev["max_tokens"]}, config["serving"])
    for name in ("eval_episode_s", "eval_job_fixed_s"):
        if f.has(name) and not f.has(name, **kernels):
            f.missing(name, why + ", on the design's attention kernels (the rehearsal before ran vLLM's own)",
                      **kernels)


# The first SFT steps compile kernels and grow the allocator's pool (the 4B rehearsal: 1.6-8.3k tokens/s against
# 13-19k after): they belong to the job's fixed part, the steps after them to its rate.
SFT_WARMUP_STEPS = 2
TIMED_RULES = ("rl", "rft", "train_sft", "evaluate", "evaluate_test", "rollout")  # priced from units, not job_s


def config_as_run(r: dict[str, Any], name: str) -> dict[str, Any]:
    """The study config a rehearsal ran with, defaults filled in: the copy its JSON carries (`config_as_run`), never
    the file as it is now, which may have changed since (env.concurrency went from 8 to 32 after the first one)."""
    from predict.config import with_defaults

    if "config_as_run" not in r:
        raise SystemExit(f"benchmarks/{name}: no config_as_run (the config file as the rehearsal ran it); "
                         f"add it from `git show {r.get('commit', '<commit>')}:{r.get('config')}`")
    return with_defaults(r["config_as_run"], source=f"{name}: config_as_run")


def rehearsal(f: Figures, card: str, suffix: str = "") -> bool:
    """Fill in from benchmarks/rehearsal_<card><suffix>.json (benchmarks/rehearsal.py collect), when it has run; its
    figures go before a benchmark's (the study's own jobs at the design's shapes), and before those of a rehearsal
    read earlier. Per step, per save, per token, per episode: the rehearsal's counts (1 RL step, checkpoint_every 1,
    8 SFT steps) are not the design's, its units are. False when the file is not there."""
    name = f"rehearsal_{card}{suffix}.json"
    r = _load(name)
    if r is None:
        return False
    from predict.runs import resolve_run

    config = config_as_run(r, name)
    model = model_facts(config, REPO)
    env, rl, sft, traces = config["env"], config["rl"], config["sft"], config["traces"]
    jobs = {j["job"]: j for j in r.get("jobs", [])}
    shape = {"shape": model.shape}
    every = [s for s in r.get("rl_steps", []) if s.get("episodes")]
    # the steps after the first (the first warms the server and the trainer up); the rehearsal's runs have one step
    # each (config/gpu-rehearsal.yaml cuts rl.steps to 1): then that one, warm-up and all (an upper bound)
    steps = [s for s in every if s.get("step", 0) > 1] or every
    which = "over the steps after the first" if steps is not every else "over the first steps (the only ones run)"
    if steps:
        src = f"{name}: rl_steps[]"
        at = {**shape, "max_tokens": rl.get("max_tokens") or env["max_tokens"], "concurrency": env["concurrency"]}
        episodes = sum(s["episodes"] for s in steps)
        f.add("rl_rollout_episode_s", sum(s["rollout_s"] for s in steps) / episodes, "s/episode",
              f"{name}: rl_steps[].rollout_s, episodes", f"rollout seconds / episodes, {which}, "
              f"{env['concurrency']} in flight beside the resident trainer", first=True, **at)
        f.add("rl_tokens_per_episode", sum(s["update_tokens"] for s in steps) / episodes, "tokens",
              f"{name}: rl_steps[].update_tokens", f"update tokens / episodes, {which}", first=True, **at)
        f.add("rl_update_tokens_per_s", sum(s["update_tokens"] for s in steps) / sum(s["update_s"] for s in steps),
              "tokens/s", f"{name}: rl_steps[].update_tokens, update_s", f"update tokens / update seconds, {which}",
              first=True, **shape, dtype=rl["dtype"], micro_batch_tokens=rl["micro_batch_tokens"],
              activation_checkpointing=checkpointing(rl["activation_checkpointing"],
                                                     rl.get("activation_checkpointing_layers")))
        f.add("rl_sleep_sync_s", statistics.mean((s.get("samples_s") or 0) + (s.get("sleep_wake_s") or 0)
                                                 + (s.get("sync_s") or 0) + (s.get("offload_s") or 0) for s in steps),
              "s/step", f"{src}.samples_s, sleep_wake_s, sync_s, offload_s",
              f"samples + sleep/wake + weight sync + optimizer offload per step, {which}",
              first=True, **shape)
        ckpt_steps = checkpoint_steps(int(rl["steps"]), int(rl["checkpoint_every"]))
        saves = rl_state_saves(int(rl["steps"]), 0, int(rl["state_every"]), ckpt_steps)
        runs = {(s["run"], s["seed"]) for s in every}
        f.add("rl_save_wait_s", sum(s.get("save_waited_s") or 0 for s in every) / (saves * len(runs)), "s/save",
              f"{src}.save_waited_s", f"what the steps waited for their saves / the {saves} save(s) a run of "
              f"{rl['steps']} step(s) makes, {len(runs)} run(s); each save holds the state (and here a checkpoint)",
              first=True, **shape, dtype=rl["dtype"])
        hf = [s["hf_save_write_s"] for s in every if s.get("hf_save_write_s")]
        if hf and model.params:
            f.add("hf_save_gb_per_s", checkpoint_bytes(model.params) / 1e9 / statistics.mean(hf), "GB/s",
                  f"{src}.hf_save_write_s", f"an HF checkpoint's bytes ({model.params:,} parameters x 2, saved bf16: "
                  "predict.train.disk.checkpoint_bytes) / its mean write seconds, in the background", first=True,
                  **shape)
        states = [s["state_save_write_s"] for s in every if s.get("state_save_write_s")]
        if states and model.params:
            links = rl_states_link_checkpoints(int(rl["steps"]), 0, int(rl["state_every"]), ckpt_steps, rl["dtype"])
            written = state_bytes(model.params, rl["dtype"]) - (checkpoint_bytes(model.params) if links else 0)
            f.add("state_save_gb_per_s", written / 1e9 / statistics.mean(states), "GB/s", f"{src}.state_save_write_s",
                  f"the state's bytes written ({STATE_BYTES_PER_PARAM[rl['dtype']]} bytes a parameter, "
                  f"predict.train.disk{', less the checkpoint weights it links' if links else ''}) / its mean "
                  "write seconds, in the background", first=True, **shape, dtype=rl["dtype"])
        # the job beyond its steps and their save waits, the server's start or reload apart: the trainer's load,
        # the disk check, the last save's writing the job waits for, publishing the checkpoints
        fixed = []
        for run, seed in sorted(runs):
            job = jobs.get(f"rl/{run}/seed{seed}")
            if job and job.get("load_s") is not None:
                mine = [s for s in every if (s["run"], s["seed"]) == (run, seed)]
                fixed.append(job["wall_s"] - job["load_s"] - sum(s["step_s"] + (s.get("save_waited_s") or 0)
                                                                 for s in mine))
        if fixed:
            f.add("rl_job_fixed_s", _median(fixed), "s", f"{name}: jobs[rl].wall_s, load_s; rl_steps[].step_s, "
                  "save_waited_s", f"median over {len(fixed)} RL job(s) of wall - server start or reload - steps - "
                  "save waits", first=True, **shape)
    _server_load_figures(f, list(jobs.values()), name, first=True, serving=config["serving"], **shape)
    # evaluation, as on the CPU: (wall - server start or reload) = fixed + episodes x per episode, fitted over the
    # evaluation jobs, at the rehearsal's evaluation settings and episodes in flight
    evals = [j for j in jobs.values() if family(j["job"].split("/")[0]) in ("evaluate", "evaluate_test")
             and j.get("episodes")]
    if evals:
        _eval_figures(f, [(j["episodes"], j["wall_s"] - (j.get("load_s") or 0)) for j in evals],
                      sum(j["output_bytes"] for j in evals), name, first=True,
                      at={**shape, "max_tokens": config["evaluation"]["max_tokens"], "concurrency": env["concurrency"]},
                      serving=config["serving"])
    sft_steps = r.get("sft_steps") or {}
    steady = [s for arm in sft_steps.values() for s in arm if s["step"] > SFT_WARMUP_STEPS]
    if steady:
        device = sft["device"] if sft["device"] != "auto" else config["serving"]["device"]
        at = {**shape, "dtype": sft["dtype"], "device": device}
        rate = sum(s["n_tokens"] for s in steady) / sum(s["time_s"] for s in steady)
        f.add("sft_tokens_per_s", rate, "tokens/s", f"{name}: sft_steps[].n_tokens, time_s",
              f"steady state: tokens / seconds of the steps after the first {SFT_WARMUP_STEPS}, "
              f"{len(sft_steps)} job(s)", first=True, **at)
        fixed = [jobs[f"train_sft/{arm}"]["wall_s"] - sum(s["n_tokens"] for s in rows) / rate
                 for arm, rows in sft_steps.items() if f"train_sft/{arm}" in jobs]
        f.add("sft_job_fixed_s", _median(fixed), "s", f"{name}: jobs[train_sft].wall_s, sft_steps[].n_tokens",
              f"median over {len(fixed)} SFT job(s) of wall - tokens at the steady rate (load, warm-up, HF save)",
              first=True, **at)
        n_traces = traces["n_direct"] + traces["n_recovery"]
        for arm, rows in sft_steps.items():
            if not any(s["epoch"] > 0 for s in rows):  # the first epoch whole only once the second began
                continue
            run = resolve_run(config, arm)
            f.add("sft_tokens_per_trace", sum(s["n_tokens"] for s in rows if s["epoch"] == 0) / n_traces, "tokens",
                  f"{name}: sft_steps[{arm}].n_tokens, epoch", f"tokens of the first epoch / {n_traces} traces, "
                  f"run {arm}", protocol=run.protocol, variant=run.variant,
                  recovery_style=traces["recovery_style"], mix=str(traces["mix"]))
    peaks: dict[str, list[tuple[float, str, str | None]]] = {}
    for job in jobs.values():
        rule, *parts = job["job"].split("/")  # train_sft/A, rl/A/seed42: the run is the second part
        fam = family(rule)
        if job.get("device_peak_gib") is not None:
            run = parts[0] if fam in ("train_sft", "rl", "rft") and parts else None
            peaks.setdefault(fam, []).append((job["device_peak_gib"], job["job"], run))
        if fam in TIMED_RULES:
            continue
        at = {"rule": fam, **(shape if fam == "build_tiny_model" else {})}
        f.add("job_s", job["wall_s"], "s", f"{name}: jobs[{job['job']}].wall_s", "the job's wall time on the node "
              "(Snakemake's benchmark)", first=True, **at)
    unbenchmarked_rule_figures(f, f"plan_measured_{card}_rehearsal{suffix}.json", set(jobs))
    _device_peak_figures(f, peaks, config, name, first=True, **shape)
    return True


def _device_peak_figures(f: Figures, peaks: dict[str, list[tuple[float, str, str | None]]], config: dict[str, Any],
                         src: str, *, first: bool, **at: Any) -> None:
    """device_peak_gib per rule family: the largest device-wide peak its jobs printed, RL's and RFT's labelled with
    the micro-batch and checkpointing they trained at. Where a family's jobs trained runs of more than one protocol,
    each protocol's largest too, ahead of the family's. Arm B's samples are longer (its prediction line, CE-only
    samples): its SFT peak was above Arm A's in every GPU run (+2.5 % at 4B, +12 % at 0.6B, the same to 0.1 GiB run
    after run), as was its RL peak in the 0.6B slice's runs (+14 %), so the family's largest put Arm A's 12-14 % high
    there. (The 4B RL peaks of three H100 rehearsals put either arm first: 50.3-57.0 GiB for Arm A.)"""
    from predict.runs import resolve_run

    rl = config["rl"]
    for fam, seen in sorted(peaks.items()):
        if not seen:
            continue
        trained_at = ({"micro_batch_tokens": rl["micro_batch_tokens"],
                       "activation_checkpointing": checkpointing(rl.get("activation_checkpointing", False),
                                                                 rl.get("activation_checkpointing_layers"))}
                      if fam in ("rl", "rft") else {})
        protocols: dict[str, list[tuple[float, str]]] = {}
        for peak, job, run in seen:
            if run is not None:
                protocols.setdefault(resolve_run(config, run).protocol, []).append((peak, job))
        entries = [] if len(protocols) < 2 else [
            (max(js), f"the {len(js)} {fam} job(s) of protocol {protocol}", {"protocol": protocol})
            for protocol, js in sorted(protocols.items())]
        entries.append((max((peak, job) for peak, job, _ in seen), f"the {len(seen)} {fam} job(s)", {}))
        # the plan takes the first entry that holds: a protocol's before the family's
        for (peak, which_job), jobs, by in (reversed(entries) if first else entries):
            f.add("device_peak_gib", peak, "GiB", f"{src}: jobs[].device_peak_gib", "the largest device-wide peak "
                  f"(nvidia-smi, every process) of {jobs}: {which_job}", first=first, family=fam, **at, **trained_at,
                  **by)


def unbenchmarked_rule_figures(f: Figures, name: str, benchmarked: set[str]) -> None:
    """A rule with no `benchmark:` (check_serving) is missing from the rehearsal's jobs, which come from benchmark
    files; `name` (plan_measured_<card>_rehearsal<suffix>.json, benchmarks/plan_check.py measure) times it from
    Snakemake's log, to the whole second. Its wall time there prices it, as the rehearsal's other rules of seconds
    are priced."""
    measured = _load(name)
    for job in (measured or {}).get("jobs", []):
        fam = family(job["rule"])
        if job["job"] in benchmarked or fam in (*TIMED_RULES, *TARGET_RULES) or not job.get("wall_from"):
            continue
        f.add("job_s", job["wall_s"], "s", f"{name}: jobs[{job['job']}].wall_s",
              f"the job's wall time on the node, from {job['wall_from']}", first=True, rule=fam)


def h200(held: set[str] = frozenset()) -> Figures:
    from predict.plan.command import load_study

    f = Figures()
    name = "gpu_slice_h200.json"
    s = _load(name)
    for job in s["jobs"]:
        fam = family(job["rule"])
        if fam in ("train_sft", "rl", "evaluate", "evaluate_test"):
            if job.get("device_peak_gib") is not None:
                at = ({"micro_batch_tokens": s["rl"]["micro_batch_tokens"],
                       "activation_checkpointing": s["rl"]["activation_checkpointing"]} if fam == "rl" else {})
                f.add("device_peak_gib", max(job["device_peak_gib"]), "GiB", f"{name}: jobs[{job['rule']}]",
                      "the largest device-wide peak the slice's job logs printed", family=fam, shape=s["shape"], **at)
            continue
        at = {"rule": fam, **({"shape": s["shape"]} if fam == "build_tiny_model" else {})}
        f.add("job_s", max(job["wall_s"]), "s", f"{name}: jobs[{job['rule']}].wall_s",
              "the slice's wall time (of a range, its upper end)", **at)
    rl_step_figures(f, "rl_step_h200_inplace_sync.json", {**_load("rl_step_h200_inplace_sync.json"),
                    "micro_batch_tokens": 8192, "activation_checkpointing": True}, "qwen3-4b",
                    _load("rl_step_h200_inplace_sync.json")["server_start_s"])
    vllm = _load("rl_step_h200_vllm.json")
    f.add("serving_reload_s", vllm["mean"]["sync_folder_s"], "s", "rl_step_h200_vllm.json: mean.sync_folder_s",
          "a checkpoint folder loaded into the running 4B server", shape="qwen3-4b")
    sft = next(r for r in _load("sft_speed_h200_int32.json")["runs"] if r["path"] == "ours")
    f.add("sft_tokens_per_s", sft["tok_s"], "tokens/s", "sft_speed_h200_int32.json: runs[ours].tok_s",
          "our trainer at the 4B shape, 4 x 2048 tokens", shape="qwen3-4b", dtype="bfloat16", device="gpu")
    f.add("device_peak_gib", sft["peak_gib"], "GiB", "sft_speed_h200_int32.json: runs[ours].peak_gib",
          "torch's peak at 4 x 2048 tokens", family="train_sft", shape="qwen3-4b")
    rehearsal(f, "h200")
    gpu_slices(f, "h200", held)
    gpu_missing(f, "h200", load_study([REPO / "config" / "config.yaml", REPO / "config" / "gpu.yaml"]))
    return f


def gpu_slices(f: Figures, card: str, held: set[str]) -> None:
    """The GPU slice's runs on this card (config/gpu-slice.yaml, benchmarks/plan_check.py measure --name
    <card>_slice_<run>), pooled, but those --hold-out names: the 0.6B shape's figures. They come after the
    rehearsal's, so a rule of seconds without a shape is priced by the rehearsal's run of it, and before a benchmark
    of one part (the workflow's own jobs first: the slice's evaluation server started in 149 s on an H100, where
    eval_repeat_h100_cold_warm.json's bare start took 107 s and priced it)."""
    names = [p.name for p in sorted(BENCH.glob(f"plan_measured_{card}_slice_*.json")) if p.name not in held]
    if not names:
        return
    runs = Figures()
    measured_run_figures(runs, names)
    for name, entries in runs.figures.items():
        there = f.figures.setdefault(name, [])
        at = next((i for i, e in enumerate(there) if not _from_a_rehearsal(e)), len(there))
        there[at:at] = entries
    f.sources |= runs.sources


def _from_a_rehearsal(entry: dict[str, Any]) -> bool:
    """An entry of a rehearsal (its JSON, or the measured file its rules of seconds come from)."""
    return any(src.startswith(("rehearsal_", "plan_measured_")) and "_slice_" not in src
               for src in source_files(entry.get("source") or ":"))


def h100(held: set[str] = frozenset()) -> Figures:
    from predict.plan.command import load_study

    f = Figures()
    d = _load("rl_step_h100_sync_orders.json")
    variant = next(v for v in d["variants"] if v["sync_order"] == "asleep")
    rl_step_figures(f, "rl_step_h100_sync_orders.json", variant, "qwen3-4b", d["server_start_s"])
    e = _load("eval_repeat_h100_cold_warm.json")
    starts = e["modes"]["invariant"]["server_start_s"]
    f.add("serving_start_s", max(starts), "s", "eval_repeat_h100_cold_warm.json: modes.invariant.server_start_s",
          "the slice's model, an empty compile cache (the larger of two starts)", shape="qwen3-0.6b",
          server="batch_invariant")
    # the rehearsal of the design's evaluation kernels (TRITON_ATTN) last, so its figures come first; the one before
    # (vLLM's own kernels) still prices a config that keeps those
    rehearsal(f, "h100")
    rehearsal(f, "h100", "_triton")
    gpu_slices(f, "h100", held)
    gpu_missing(f, "h100", load_study([REPO / "config" / "config.yaml", REPO / "config" / "gpu.yaml"]))
    return f


def own_traces(workload: Figures) -> None:
    """sft_tokens_per_trace of the runs no measured run trained on traces of their own (the environment variants:
    the embedded default trains them from the base arm's SFT), and the ``run_traces`` rule's output bytes, from
    ``trace_tokens.json`` (benchmarks/trace_tokens.py: the variant's traces rendered and counted as SFT counts them,
    no training). Conditions a measured SFT job already gives are left to it."""
    name = "trace_tokens.json"
    r = _load(name)
    if r is None:
        return
    seen = [e["at"] for e in workload.figures.get("sft_tokens_per_trace", [])]
    for run in r["runs"]:
        at = {k: run[k] for k in ("protocol", "variant", "recovery_style", "mix")}
        if at not in seen:
            workload.add("sft_tokens_per_trace", run["tokens_per_trace"], "tokens", f"{name}: runs[{run['run']}]",
                         f"tokens SFT trains on in one epoch / {run['traces']} traces, run {run['run']}'s traces "
                         "rendered from its base arm's and tokenized (no training)", **at)
            seen.append(at)
    rendered = [run["parquet_bytes"] for run in r["runs"] if run["variant"] != "none"]
    if rendered:
        workload.add("output_bytes", _median(rendered), "bytes", f"{name}: runs[].parquet_bytes",
                     f"median of {len(rendered)} rendered runs' traces parquet", rule="run_traces")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hold-out", action="append", default=[], metavar="NAME",
                    help="a plan_measured_cpu_NAME.json (or plan_measured_NAME.json: a GPU slice's run, "
                         "h100_slice_run2) to leave out of the figures (the out-of-sample check's run: "
                         "benchmarks/plan_check.py compare --measured)")
    args = ap.parse_args()
    held = {f"plan_measured_{prefix}{name}.json" for name in args.hold_out for prefix in ("cpu_", "")}
    measured = [p.name for p in sorted(BENCH.glob("plan_measured_cpu_*.json")) if p.name not in held]
    if not measured:
        print("no benchmarks/plan_measured_cpu_*.json left to calibrate from: run benchmarks/plan_check.py measure")
        return 1
    kinds = {"cpu": (cpu(measured), "2-core CPU (the development machine), vLLM's CPU build", 2),
             "h200": (h200(held), "one NVIDIA H200 (141 GiB), 16 cores", 16),
             "h100": (h100(held), "one NVIDIA H100 80GB, 16 cores", 16)}
    workload = Figures()
    for figures, _, _ in kinds.values():  # what the study's data and trainer make, on any device
        for name in WORKLOAD:
            if figures.has(name):
                moved = figures.figures.pop(name)
                workload.figures.setdefault(name, []).extend(moved)
                workload.sources.update(f for e in moved if e.get("source") for f in source_files(e["source"]))
    own_traces(workload)
    state_dtypes = {e["at"]["dtype"] for e in workload.figures.get("state_bytes_per_param", [])}
    for dtype, per_param in STATE_BYTES_PER_PARAM.items():  # no run measured its state folder: the trainer's layout
        if dtype not in state_dtypes:
            workload.figures.setdefault("state_bytes_per_param", []).append(
                {"value": float(per_param), "unit": "bytes/param", "at": {"dtype": dtype},
                 "source": "src/predict/train/disk.py: STATE_BYTES_PER_PARAM",
                 "how": "the trainer state's documented layout (weights, Kahan buffer, two moments); no run measured "
                        "its folder at this dtype"})
    outputs = [workload.write("workload", "device-independent: the study's data, traces and trainer state", 0)]
    outputs += [figures.write(kind, device, cores) for kind, (figures, device, cores) in kinds.items()]
    for out in outputs:
        print(out.relative_to(REPO))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
