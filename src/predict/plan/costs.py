"""What one job costs: its work in units (episodes, steps, tokens, checkpoints) from the config and the job itself,
priced by the calibration's per-unit figures.

Rules:

* A job's work comes from the config and from Snakemake's job (its wildcards, outputs and command), never from a
  count of our own: an evaluation job serves the checkpoints its command names, a test campaign job every entry it
  lists.
* Every part of a job's time is a calibrated figure times a unit count. A part whose figure the calibration lacks
  at the job's conditions (`predict.plan.calibration`) is left out of ``known_s`` and named in ``missing``: the
  job's time is then "not calibrated" (``wall_s`` None) and ``known_s`` is only what the calibrated parts add up to.
* A serving job pays the server's start or its reload of this checkpoint, then its work. Which of the two is the
  schedule's to say (`predict.plan.schedule`): ``load`` holds both prices.
* Rollout figures hold for a reply length and a concurrency, whatever the weights: a random model's replies run to
  the length cap, so a figure measured on one is an upper bound for a trained model at the same cap.
* A job runs other stages' code only where it says so: RFT samples as RL rolls out and updates with RL's trainer, so
  where no RFT job was measured at its counts it is priced as those parts at the RL figures of the same conditions
  (``units["priced_from"]``, ``units["peak_from"]``), an upper bound (`Pricer._rft`). Likewise a rule of seconds
  that no run on a device ran, by the seconds there of the rule whose work contains its own (`STAND_INS`).
* An evaluation's time figures also hold for the attention kernels its server runs (`evaluation_timed_at`): the design
  chooses them (serving.evaluation_attention_backend) because they change rows and time alike, so a figure measured
  on vLLM's own kernels does not price an evaluation on TRITON_ATTN (1.51x the default serving's time at 4B).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from predict.config.models import StudyConfig
from predict.plan.calibration import Calibration, Missing
from predict.plan.dag import Job
from predict.runs import checkpoint_steps
from predict.train.disk import rl_state_saves, rl_states_link_checkpoints

# A rule of seconds that no run on a device ran (the GPU runs have no ablations, extensions or runs with traces of
# their own), and the rule on the same device whose work contains its own: an ablation's or extension's table is
# `stats`' reading of evaluation tables and its tests, for one run against its base instead of the two arms (on the
# 2-core CPU, which ran all three: 2.1 and 2.2 s against 2.5); `run_traces` renders one run's traces under its own
# rules, reusing the base arm's verdicts, where `sft_traces` renders both arms' and runs the sandbox for them.
STAND_INS = {"ablation": "stats", "extension": "stats", "run_traces": "sft_traces"}

# Rules that only name targets: nothing runs.
TARGET_RULES = {"all", "design", "test"}
DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}


def checkpointing(enabled: bool, layers: int | None) -> bool | str:
    """The update's activation checkpointing (rl.activation_checkpointing, rl.activation_checkpointing_layers) as a
    figure's condition: on, off, or (selective) "first N layers", which no figure measured with every layer
    recomputing or none matches (a string never equals True). benchmarks/calibrate.py labels its figures with it."""
    if enabled and layers is not None:
        return f"first {layers} layers"
    return enabled


def server_key(family: str, serving: Any) -> str:
    """The server a job of this rule family leases: an evaluation's is batch-invariant where serving is (the GPU
    build; a server started without it starts again), every other one, and the CPU's evaluations, lease the one RL
    leases. benchmarks/calibrate.py labels a measured server start with it."""
    from predict.serving.identity import batch_invariant

    evaluation = family in ("evaluate", "evaluate_test")
    return "batch_invariant" if evaluation and batch_invariant(serving) else "default"


def evaluation_timed_at(at: Mapping[str, Any], serving: Any) -> dict[str, Any]:
    """An evaluation's time conditions: `at` (shape, reply length, concurrency) and its server's attention kernels
    (None: vLLM's choice, or no batch-invariant evaluation server, as on the CPU). benchmarks/calibrate.py labels its
    evaluation figures with it."""
    from predict.serving.identity import evaluation_attention_backend

    return {**at, "attention_backend": evaluation_attention_backend(serving)}


def family(rule: str) -> str:
    """The rule a job prices as: the per-run evaluation rules are one family each."""
    if rule.startswith("evaluate_test"):
        return "evaluate_test"
    if rule.startswith("evaluate_"):
        return "evaluate"
    return rule


@dataclass(frozen=True)
class ModelFacts:
    """The model a study trains, as far as cost goes: its shape, whether its weights are random, its size."""

    shape: str
    weights: str  # "random" (the embedded default's and the slices' built model) or "trained"
    params: int | None
    tied: bool


def model_facts(config: Mapping[str, Any], repo: Path) -> ModelFacts:
    """Shape and parameter count of `model.base`: the built tiny model's settings, a local folder's config.json, or
    a released Qwen3 shape its name names (`predict.tiny_model.SHAPES`)."""
    import json

    from predict.tiny_model import QWEN3_VOCAB_SIZE, SHAPES, TINY_DIMENSIONS, tensor_shapes

    model = StudyConfig.model_validate(dict(config)).model
    base = model.base
    if base == "tiny":
        tiny = model.tiny
        shape = tiny.shape
        dims = dict(SHAPES[shape]) if shape else {**TINY_DIMENSIONS, "hidden_size": tiny.hidden_size,
                                                  "num_hidden_layers": tiny.num_layers}
        key = shape or f"tiny-h{dims['hidden_size']}-l{dims['num_hidden_layers']}"
        tied = tiny.tie_word_embeddings
        cfg, weights = {**dims, "vocab_size": QWEN3_VOCAB_SIZE, "tie_word_embeddings": tied}, "random"
    else:
        folder = (repo / base) if not Path(base).is_absolute() else Path(base)
        weights = "trained"
        if (folder / "config.json").is_file():
            cfg = json.loads((folder / "config.json").read_text())
            cfg.setdefault("head_dim", cfg["hidden_size"] // cfg["num_attention_heads"])
            key = next((k for k, d in SHAPES.items() if all(cfg.get(n) == v for n, v in d.items())),
                       f"h{cfg['hidden_size']}-l{cfg['num_hidden_layers']}")
        else:
            key = next((k for k in SHAPES if k in base.lower().replace("_", "-")), base)
            if key not in SHAPES:
                return ModelFacts(key, weights, None, False)
            # the released Qwen3 checkpoints up to 4B tie the embedding and the head
            cfg = {**SHAPES[key], "vocab_size": QWEN3_VOCAB_SIZE, "tie_word_embeddings": True}
        tied = cfg.get("tie_word_embeddings") is True  # the checkpoint's config.json, not the study's
    params = sum(math.prod(shape) for shape, _ in tensor_shapes(cfg).values())
    return ModelFacts(key, weights, params, tied)


@dataclass
class JobCost:
    job: Job
    family: str
    gpus: float = 0.0
    startup_s: float = 0.0  # beside other jobs
    work_s: float = 0.0  # the job's own work (under the lease for a serving job)
    load: dict[str, float | None] = field(default_factory=dict)  # "start" / "reload": the lease's first part
    server_key: str | None = None  # a lease on a server started with another key pays "start"
    missing: list[Missing] = field(default_factory=list)
    device_peak_gib: float | None = None
    host_peak_mib: float | None = None
    disk_bytes: float | None = 0.0  # what it leaves on disk
    transient_bytes: float | None = 0.0  # what it holds on disk while it runs (RL state), deleted after
    units: dict[str, Any] = field(default_factory=dict)

    @property
    def serving(self) -> bool:
        return self.server_key is not None


class Pricer:
    """Prices jobs of one config on one calibration."""

    def __init__(self, config: Mapping[str, Any], cal: Calibration, repo: Path) -> None:
        self.config, self.cal, self.repo = config, cal, repo
        self.study = StudyConfig.model_validate(dict(config))
        self.model = model_facts(config, repo)
        self.device = "gpu" if self.study.serving.device == "gpu" else "cpu"

    # -- figures ------------------------------------------------------------------------------------------------
    def figure(self, cost: JobCost, name: str, **at: Any) -> float | None:
        entry = self.cal.entry(name, at)
        if entry is None:
            cost.missing.append(Missing(name, tuple(at.items()), self.cal.missing_reason(name, at)))
            return None
        return float(entry["value"])

    def _add(self, cost: JobCost, value: float | None, times: float = 1.0, *, startup: bool = False) -> None:
        if value is None:
            return
        if startup:
            cost.startup_s += value * times
        else:
            cost.work_s += value * times

    # -- units --------------------------------------------------------------------------------------------------
    def split_size(self, split: str) -> int:
        data = self.study.data
        sizes = data.sizes.model_dump()
        if split != "val":
            return sizes[split]
        path = self.repo / data.mbpp_path
        total = sum(1 for line in path.read_text().splitlines() if line.strip())
        return total - sum(sizes.values())

    def eval_tasks(self, split: str) -> int:
        n = self.study.evaluation.tasks
        size = self.split_size(split)
        return min(n, size) if n else size

    def checkpoint_bytes(self, dtype: str) -> float | None:
        """An HF checkpoint folder: its weights as saved (bf16 whatever the training dtype: the measured bytes per
        parameter) and the files beside them."""
        per_param, extra = self.cal.entry("checkpoint_bytes_per_param"), self.cal.entry("checkpoint_extra_bytes")
        if self.model.params is None or per_param is None or extra is None:
            return None
        return self.model.params * float(per_param["value"]) + float(extra["value"])

    def serving_at(self, max_tokens: int) -> dict[str, Any]:
        return {"shape": self.model.shape, "max_tokens": max_tokens,
                "concurrency": self.study.env.concurrency}

    # -- jobs ---------------------------------------------------------------------------------------------------
    def price(self, job: Job) -> JobCost:
        fam = family(job.rule)
        cost = JobCost(job, fam, gpus=job.resource("gpu"))
        if job.rule in TARGET_RULES:
            return cost
        method = getattr(self, "_" + fam, None)
        if fam.startswith("prime_rl"):
            cost.missing.append(Missing(f"job_s.{fam}", (("device", self.cal.kind),),
                                        "prime-rl's jobs have not run on a calibrated device"))
        elif method is not None:
            method(job, cost)
        else:
            self._fixed(job, cost)
        if cost.gpus and fam not in ("check_serving",):
            at = {"shape": self.model.shape, **self._peak_at(fam)}
            peak_of = fam
            if fam == "rft" and self.cal.entry("device_peak_gib", {"family": fam, **at}) is None:
                # RFT trains with RL's Trainer.step at the same micro-batch, beside the same server asleep (a shared
                # lease sleeps when it ends), and has no weight sync: the RL job's peak bounds it
                peak_of = cost.units["peak_from"] = "rl"
            protocol = self._protocol_at(job)  # its protocol's peak where one was measured, else the family's
            if protocol and self.cal.entry("device_peak_gib", {"family": peak_of, **at, **protocol}) is not None:
                at |= protocol
            cost.device_peak_gib = self.figure(cost, "device_peak_gib", family=peak_of, **at)
        host = self.cal.entry("host_peak_mib", {"family": fam, "shape": self.model.shape})
        cost.host_peak_mib = float(host["value"]) if host else None
        return cost

    def _protocol_at(self, job: Job) -> dict[str, Any]:
        """The protocol of the run a training job trains (its `run` or `arm` wildcard): Arm B's samples are longer
        (its prediction line, CE-only samples), so its peak is measured apart where a run had both arms; a job of
        no one run (an evaluation's) is priced by its family's largest peak."""
        from predict.runs import resolve_run

        run = job.wildcards.get("run") or job.wildcards.get("arm")
        return {"protocol": resolve_run(self.config, run).protocol} if run else {}

    def _peak_at(self, fam: str) -> dict[str, Any]:
        if fam in ("rl", "rft"):
            rl = self.study.rl
            return {"micro_batch_tokens": rl.micro_batch_tokens,
                    "activation_checkpointing": checkpointing(rl.activation_checkpointing,
                                                              rl.activation_checkpointing_layers)}
        return {}

    def _update_at(self) -> dict[str, Any]:
        """The conditions of a training update's figures (the RL trainer's; RFT runs the same `Trainer.step`)."""
        rl = self.study.rl
        return {"shape": self.model.shape, "dtype": rl.dtype, **self._peak_at("rl")}

    def _fixed(self, job: Job, cost: JobCost) -> None:
        """A job with no unit count of its own (data, statistics, the report): its rule's measured seconds, else
        those of the rule whose work contains its own (`STAND_INS`), an upper bound that says so."""
        rule = cost.family
        stand_in = STAND_INS.get(rule)
        if (self.cal.entry("job_s", {"rule": rule}) is None and stand_in
                and self.cal.entry("job_s", {"rule": stand_in}) is not None):
            rule = stand_in
            cost.units["priced_from"] = f"the {stand_in} rule's seconds on this device (none of its runs ran this rule)"
        self._add(cost, self.figure(cost, "job_s", rule=rule))
        self._outputs_disk(job, cost)

    def _outputs_disk(self, job: Job, cost: JobCost) -> None:
        entry = self.cal.entry("output_bytes", {"rule": cost.family})
        if entry is None:
            cost.disk_bytes = None
            cost.missing.append(Missing("output_bytes", (("rule", cost.family),)))
        else:
            cost.disk_bytes = float(entry["value"])

    def _build_tiny_model(self, job: Job, cost: JobCost) -> None:
        self._add(cost, self.figure(cost, "job_s", rule="build_tiny_model", shape=self.model.shape))
        cost.disk_bytes = self.checkpoint_bytes("bfloat16")

    def _train_sft(self, job: Job, cost: JobCost) -> None:
        sft, traces = self.study.sft, self.study.traces
        from predict.runs import resolve_run

        run = resolve_run(self.config, job.wildcards["arm"])  # an arm, or a run with its own SFT (irreversible_A)
        n_traces = traces.n_direct + traces.n_recovery
        per_trace = self.figure(cost, "sft_tokens_per_trace", protocol=run.protocol, variant=run.variant,
                                recovery_style=traces.recovery_style, mix=traces.mix)
        tokens = None if per_trace is None else per_trace * n_traces * sft.epochs
        cost.units = {"tokens": tokens, "traces": n_traces, "epochs": sft.epochs}
        at = {"shape": self.model.shape, "dtype": sft.dtype, "device": self._sft_device()}
        self._add(cost, self.figure(cost, "sft_job_fixed_s", **at))
        rate = self.figure(cost, "sft_tokens_per_s", **at)
        if rate is not None and tokens is not None:
            self._add(cost, tokens / rate)
        cost.disk_bytes = self.checkpoint_bytes(sft.dtype)

    def _sft_device(self) -> str:
        device = self.study.sft.device
        return self.device if device == "auto" else device

    def _serving_job(self, cost: JobCost) -> None:
        at = {"shape": self.model.shape}
        key = cost.server_key = server_key(cost.family, self.study.serving)
        missing = len(cost.missing)
        # a start depends on the server it starts: the batch-invariant one compiles its graphs deterministically
        # (the 4B on an H100: 174 s against the RL server's 97 s); a reload is the same on either
        cost.load = {"start": self.figure(cost, "serving_start_s", **at, server=key),
                     "reload": self.figure(cost, "serving_reload_s", **at)}
        # which one the lease pays is the schedule's: a gap in either counts once it is the one paid
        cost.missing, cost.units["load_missing"] = cost.missing[:missing], cost.missing[missing:]

    def _evaluate(self, job: Job, cost: JobCost) -> None:
        split = "test" if cost.family == "evaluate_test" else "val"
        checkpoints = len(job.flag_values("--checkpoint")) or len(job.outputs)
        episodes = checkpoints * self.eval_tasks(split) * self.study.evaluation.samples
        cost.units = {"checkpoints": checkpoints, "episodes": episodes}
        self._serving_job(cost)
        at = self.serving_at(self.study.evaluation.max_tokens)  # what it writes: the same on any kernels
        timed_at = evaluation_timed_at(at, self.study.serving)
        self._add(cost, self.figure(cost, "eval_job_fixed_s", **timed_at))
        self._add(cost, self.figure(cost, "eval_episode_s", **timed_at), episodes)
        per_episode = self.cal.entry("eval_bytes_per_episode", at)
        cost.disk_bytes = float(per_episode["value"]) * episodes if per_episode else None
        if per_episode is None:
            cost.missing.append(Missing("eval_bytes_per_episode", tuple(at.items())))

    _evaluate_test = _evaluate

    def _rl_tokens(self) -> int:
        return self.study.rl.max_tokens or self.study.env.max_tokens

    def _rl(self, job: Job, cost: JobCost) -> None:
        rl = self.study.rl
        steps, episodes = rl.steps, rl.tasks_per_step * rl.group_size
        ckpt_steps = checkpoint_steps(steps, rl.checkpoint_every)  # the driver's: every checkpoint_every, the last
        checkpoints = len(ckpt_steps)
        cost.units = {"steps": steps, "episodes_per_step": episodes, "checkpoints": checkpoints}
        self._serving_job(cost)
        at = self.serving_at(self._rl_tokens())
        self._add(cost, self.figure(cost, "rl_job_fixed_s", shape=self.model.shape))
        self._add(cost, self.figure(cost, "rl_rollout_episode_s", **at), steps * episodes)
        tokens = self.figure(cost, "rl_tokens_per_episode", **at)
        rate = self.figure(cost, "rl_update_tokens_per_s", **self._update_at())
        if tokens is not None and rate is not None:
            self._add(cost, steps * episodes * tokens / rate)
        self._add(cost, self.figure(cost, "rl_sleep_sync_s", shape=self.model.shape), steps)
        # Per save, not per step: a run of other intervals than the measured one saves as often as the driver's
        # rule says (every state_every steps, each checkpoint step, the last); each save waits for its copies off
        # the device while its folders are written beside the next steps. The last save's writing, which the job
        # waits for, is in rl_job_fixed_s (a run ends with one state and one checkpoint, measured or planned).
        saves = rl_state_saves(steps, 0, rl.state_every, ckpt_steps)
        cost.units["saves"] = saves
        self._add(cost, self.figure(cost, "rl_save_wait_s", shape=self.model.shape, dtype=rl.dtype), saves)
        ckpt = self.checkpoint_bytes(rl.dtype)
        cost.disk_bytes = None if ckpt is None else ckpt * checkpoints
        if not rl.keep_state:
            state = self.cal.entry("state_bytes_per_param", {"dtype": rl.dtype})
            if state and self.model.params:
                # as predict.train.disk counts it: a state that links its step's checkpoint adds its optimizer part
                # only, and one being replaced is on disk twice
                own = float(state["value"]) * self.model.params
                if rl_states_link_checkpoints(steps, 0, rl.state_every, ckpt_steps, rl.dtype) and ckpt is not None:
                    own -= ckpt
                cost.transient_bytes = own * (2 if saves > 1 else 1)
            else:
                cost.transient_bytes = None
            if cost.transient_bytes is None:
                cost.missing.append(Missing("state_bytes_per_param", (("dtype", rl.dtype),),
                                            self.cal.missing_reason("state_bytes_per_param", {"dtype": rl.dtype})))

    def _rft(self, job: Job, cost: JobCost) -> None:
        """The run's measured whole-job figure where the calibration holds one at its counts; else its parts
        (`predict.train.rft`): one sampling of tasks x G episodes, then ``rl.steps`` updates on ``batch_rollouts``
        kept rollouts each and the driver's saves, at the RL figures of the same conditions. Both parts price an
        upper bound: the RL rollout figure was measured beside a resident trainer (RFT samples before the trainer
        loads), and a kept rollout passed, so it is no longer than an average one. No weight sync: the sampling
        server is never updated."""
        from predict.train.rft import rft_settings

        rl, rft = self.study.rl, rft_settings(self.config)  # an rft job exists only where the config has an rft section
        split = self.split_size("rl")
        tasks = min(rft.tasks, split) if rft.tasks else split  # rft.tasks null: every rl task
        ckpt_steps = checkpoint_steps(rl.steps, rl.checkpoint_every)
        saves = rl_state_saves(rl.steps, 0, rl.state_every, ckpt_steps)
        cost.units = {"steps": rl.steps, "tasks": tasks, "group": rft.group_size,
                      "episodes": tasks * rft.group_size, "batch_rollouts": rft.batch_rollouts, "saves": saves}
        self._serving_job(cost)
        at = self.serving_at(self._rl_tokens())
        whole = self.cal.entry("rft_job_s", {**at, "steps": rl.steps, "tasks": rft.tasks, "group_size": rft.group_size})
        if whole is not None:
            self._add(cost, float(whole["value"]))
        else:
            cost.units["priced_from"] = "RL figures (sampling, updates, saves)"
            self._add(cost, self.figure(cost, "rl_job_fixed_s", shape=self.model.shape))
            self._add(cost, self.figure(cost, "rl_rollout_episode_s", **at), tasks * rft.group_size)
            tokens = self.figure(cost, "rl_tokens_per_episode", **at)
            rate = self.figure(cost, "rl_update_tokens_per_s", **self._update_at())
            if tokens is not None and rate is not None:
                self._add(cost, rl.steps * rft.batch_rollouts * tokens / rate)
            self._add(cost, self.figure(cost, "rl_save_wait_s", shape=self.model.shape, dtype=rl.dtype), saves)
        ckpt = self.checkpoint_bytes(rl.dtype)
        cost.disk_bytes = None if ckpt is None else ckpt * (rl.steps // rl.checkpoint_every)

    def _rollout(self, job: Job, cost: JobCost) -> None:
        tasks = self.study.env.rollout_tasks or self.split_size(job.wildcards.get("split", "val"))
        cost.units = {"episodes": tasks}
        self._serving_job(cost)
        at = self.serving_at(self.study.env.max_tokens)
        self._add(cost, self.figure(cost, "eval_job_fixed_s", **at))
        self._add(cost, self.figure(cost, "rollout_episode_s", **at), tasks)
        cost.disk_bytes = None
