"""`predict signal`: the learning-signal run. Does training through the study's code paths move a model at all?

On the embedded default the random tiny Qwen3 never solves a task, so every reward, advantage and RL loss is 0 and a
trainer that silently does nothing (updates rounded away, an advantage with the wrong sign, a mask one token off)
passes every other test. This run gives the tiny model something to learn and checks that it learns it.

Why a stage and not a benchmark: it asserts behaviour (a margin), not speed, and its tables and figure are study
outputs like any other (parquet through pyarrow, a PNG beside them); `tests/test_learning_signal.py` runs it in CI
with the defaults below and asserts on the verdicts it writes.

Rules it follows:

* **Same code paths as the study.** Traces from `predict.traces.stage.run_stage`, SFT through `Trainer.step` on
  `predict.train.sft.render_messages` samples, RL through `predict.train.rl.run_rl` itself (rollouts with the train
  client's token graph against vLLM's CPU server, `build_samples`, one `Trainer.step`, weights reloaded into the
  running server in place). Nothing here re-implements a step; the only help `run_rl` gets is a shared server
  (one vLLM start-up for all runs instead of one per run).
* **Start point.** A tiny Qwen3 (`SignalSettings.hidden_size`) is fine-tuned on ``n_tasks`` sft recovery tasks
  (those with the shortest traces), each as two prefixes that end at the fork (`fork_traces`): up to its gold
  patch and up to its recovery trace's faulty patch (the faulty one ``faulty_repeats`` times), in the arm's format,
  at the signal run's ``budget`` of 2 calls (read_file, apply_patch: the episode ends at the patch and is graded).
  It stops when the probability of sampling exactly the gold or the faulty prefix at temperature 1 (exp of the
  summed assistant-token log-probs) reaches ``target_path_prob``: a model that writes the faulty patch more often
  than the gold one, rarely anything else, and so solves its tasks sometimes but not always. Arm B's start point
  goes on from Arm A's (same tasks and patches; it learns the predictive prompt and the prediction turn). (A start
  point fine-tuned on whole gold traces failed by rare slips spread over every token; GRPO did not raise its
  reward in 8 steps at any lr: docs/learning-signal.md.)
* **A sanity run, not the study's design.** RL trains on the very tasks SFT saw (the study's rl split is disjoint
  from sft); every table and the figure say so.
* **Arm A:** GRPO for ``rl_steps`` steps, once per seed, and once with lr 0 (the control). A run's rise is the mean
  reward of its last ``k`` steps minus that of its first ``k``. The run repeats (seeded sampling; the same seeds gave
  the same curves on every machine and run measured), so its verdicts are decided by what it shows, once: the mean
  rise over the seeds must reach ``reward_margin``, every seed's rise must exceed the control's, and the control's
  must stay below ``reward_margin`` (docs/learning-signal.md: why a mean, and why not a margin per seed).
* **Arm B:** ``label_steps`` of the same RL from the Arm B start point with alpha 1 (run ``B``) and alpha 0
  (ablation ``alpha0``); its
  faulty patches' verified classes are the non-PASS labels (SFT never shows a prediction after one). The label
  log-prob is log p(verified label | the call's prefix) summed over the label tokens, at every prediction
  point both runs recorded (one fixed set, so both curves start from the same value), under the SFT weights
  (step 0) and each step's checkpoint. Its rise over the run must be at least ``label_margin`` (nats) larger with
  alpha 1 than with alpha 0.
* Verdicts are margins, never exact values; the numbers are in ``curves.parquet`` (a row per run and step) and
  ``verdicts.parquet`` (a row per check), the figure in ``signal.png``.
* **Watchable**: with tracking settings (``predict signal`` passes the config's) every SFT and RL step goes live
  to TensorBoard under ``signal/`` (`predict.train.tracking`): ``signal/sft/<arm>``, ``signal/<run>/rl/...``.
* **Cheap enough for CI** (about 4-5 minutes on 2 cores with the defaults): every rollout costs vLLM-CPU about the
  same (its sampler over Qwen3's 151,936-token vocabulary is half of the engine's time), so the defaults spend
  rollouts where the verdicts need them: 2 tasks x 16 rollouts a step (a task's group sees both patches), 5 steps
  for Arm A, 2 for Arm B (its label check needs no more), and episodes that end at the patch.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.parquet as pq

from predict.outputs import write_table

if TYPE_CHECKING:
    from predict.stages import StageSettings

log = logging.getLogger(__name__)

SANITY_NOTE = (
    "sanity run: RL trains on the same tasks SFT saw (not the study's disjoint sft/rl design); it shows that "
    "training moves the model, not how well it generalises"
)


@dataclass(frozen=True)
class SignalSettings:
    """Everything the signal run chooses (the CI defaults; `predict signal` has flags for the run's shape: seeds,
    steps, lr, group size, tasks, k, the SFT target)."""

    n_tasks: int = 2
    """sft recovery tasks trained on (those with the shortest Arm A recovery traces)."""
    hidden_size: int = 64  # the signal run's own model (its flags), not a config default
    num_layers: int = 2  # the signal run's own model (its flags), not a config default
    sft_lr: float = 1.0e-2
    sft_max_steps: int = 150
    faulty_repeats: int = 2
    """Each faulty prefix is in the SFT batch this many times, the gold one once: the start point writes the
    faulty patch about three times as often as the gold one (measured 0.66 vs 0.20; a start reward near 1/5, room
    to rise)."""
    target_path_prob: float = 0.85
    """SFT stops when the model samples the gold or the faulty prefix exactly (T=1) with this probability (mean
    over tasks): the rest are slips spread over many tokens, which GRPO barely moves."""
    rl_steps: int = 5
    """Arm A's RL steps (each run)."""
    label_steps: int = 2
    """Arm B's RL steps (each run): the label log-prob's rise with alpha 1 shows from the first step."""
    group_size: int = 16
    """Arm A's rollouts per task and step."""
    label_group_size: int = 8
    """Arm B's rollouts per task and step: its check needs prediction points, not a precise reward."""
    rl_lr: float = 5.0e-4
    max_tokens: int = 64
    budget: int = 2
    """Tool-call budget of both arms (the study's is 8): read_file and apply_patch, then the episode ends (after
    Arm B's prediction) and solution.py is graded. Every token a rollout samples is part of the choice the reward
    hangs on; at 8, calls after a slip were most of a rollout's tokens and noise to the reward."""
    seeds: tuple[int, ...] = (1, 2)
    k: int = 2
    """Steps averaged at each end of the reward curve."""
    reward_margin: float = 0.15
    label_margin: float = 0.1
    extra: dict[str, Any] = field(default_factory=dict)


# ---------------------------------------------------------------------------------------------------------------
# Data: the handful of tasks and their traces
# ---------------------------------------------------------------------------------------------------------------
def fork_traces(rows: Sequence[Mapping[str, Any]], task_ids: Sequence[int]) -> list[dict]:
    """One arm's SFT rows of the signal run: for each recovery task in `task_ids`, two prefixes that end at the
    fork: the task's gold patch (role ``gold``) and its recovery trace's faulty patch (role ``faulty``), each after
    the same system prompt, task, read_file and its result. In the predictive format the gold prefix goes on through
    the patch's result and its prediction (PASS, KEEP); the faulty one ends at the patch, so SFT never shows a
    prediction after a faulty patch and Arm B's label check starts from labels the model does not know.

    Why two prefixes: the reward then hangs on one learnable choice with a large gradient (the module doc's start
    point, `SignalSettings.budget`). The fixed turns come from the arm's first direct trace; every piece is checked."""
    from predict.env.protocol import parse_prediction
    from predict.traces.render import STUB_FIND, patch_line

    template = next((r for r in rows if r["role"] == "direct"), None)
    if template is None:
        raise ValueError("no direct trace to take the fixed turns from")
    t = template["messages"]
    # The predictive format answers the applied patch with a prediction turn; the reactive one goes on to the test.
    after_patch = t[5:7] if t[6]["role"] == "assistant" and parse_prediction(t[6]["content"]).valid else []
    by_task = {r["task_id"]: r for r in rows if r["role"] == "recovery"}
    out: list[dict] = []
    for task_id in task_ids:
        row = by_task.get(task_id)
        if row is None:
            raise ValueError(f"task {task_id}: no recovery trace")
        m, fm = row["messages"], row["faulty_message"]
        where = f"recovery trace of task {task_id}"
        if fm != 4 or [x["content"] for x in (m[0], m[2], m[3])] != [x["content"] for x in (t[0], t[2], t[3])]:
            raise ValueError(f"{where}: not system, task, read_file, its result, faulty patch")
        if m[fm]["content"] != patch_line(STUB_FIND, row["faulty_code"]):
            raise ValueError(f"{where}: turn {fm} is not the faulty patch")
        gold = [*m[:fm], {"role": "assistant", "content": patch_line(STUB_FIND, row["gold_code"])}, *after_patch]
        base = {"task_id": task_id, "gold_code": row["gold_code"], "faulty_code": row["faulty_code"], "n_tool_calls": 2}
        out.append({**base, "role": "gold", "messages": gold})
        out.append({**base, "role": "faulty", "messages": m[: fm + 1]})
    return out


def pick_tasks(traces_dir: Path, tokenizer: Any, n_tasks: int, *, enable_thinking: bool) -> dict[str, list[dict]]:
    """The SFT rows of each arm (`fork_traces`) on the ``n_tasks`` recovery tasks with the shortest Arm A recovery
    traces (fewest assistant tokens, rendered as config model.enable_thinking says; ties by task id)."""
    from predict.train.sft import render_messages

    def length(row: Mapping[str, Any]) -> tuple[int, int]:
        sample = render_messages(row["messages"], tokenizer, enable_thinking=enable_thinking)
        return sample.n_ce_tokens, int(row["task_id"])

    a_rows = pq.read_table(traces_dir / "A.parquet").to_pylist()
    b_rows = pq.read_table(traces_dir / "B.parquet").to_pylist()
    recovery = sorted((r for r in a_rows if r["role"] == "recovery"), key=length)[:n_tasks]
    if len(recovery) < n_tasks:
        raise ValueError(f"{traces_dir}: {len(recovery)} recovery traces, {n_tasks} wanted")
    ids = sorted(r["task_id"] for r in recovery)
    return {"A": fork_traces(a_rows, ids), "B": fork_traces(b_rows, ids)}


def at_budget(rows: Sequence[Mapping[str, Any]], config: StageSettings, arm: str, budget: int) -> list[dict]:
    """The trace rows as the traces stage would render them at `budget`: only the system prompt names the budget,
    so it is swapped for the protocol's prompt at `budget`. A trace that would not fit is an error, never a silent
    mismatch: the episode ends after the call that spends the last unit, so a trace that ends in FINAL needs a
    spare call and one that ends at its last call (a prefix) needs no more calls than the budget."""
    from predict.env.protocol import ProtocolConfig, parse_action

    protocol, env = config.arms[arm].protocol, config.env
    old = ProtocolConfig.from_env(env, protocol).system_prompt()
    new = ProtocolConfig.from_env(env.model_copy(update={"budget": budget}), protocol).system_prompt()
    out = []
    for row in rows:
        messages = [dict(m) for m in row["messages"]]
        if messages[0]["role"] != "system" or messages[0]["content"] != old:
            raise ValueError(f"trace of task {row['task_id']} (arm {arm}): its system prompt is not the protocol's")
        last = messages[-1]
        ends_final = last["role"] == "assistant" and parse_action(last["content"]).kind == "final"
        if row["n_tool_calls"] > budget - ends_final:
            end = "before FINAL" if ends_final else "before its last call"
            raise ValueError(f"trace of task {row['task_id']} (arm {arm}) uses {row['n_tool_calls']} calls: a "
                             f"budget of {budget} ends it {end}")
        messages[0]["content"] = new
        out.append({**row, "messages": messages})
    return out


def trace_probs(trainer: Any, samples: Sequence[Any]) -> list[float]:
    """Probability of sampling each trace's assistant tokens exactly at temperature 1 under the current weights."""
    return [math.exp(sum(lp)) for lp in trainer.token_logprobs(samples, weighted_only=True)]


def sft_start_point(
    rows: Sequence[Mapping[str, Any]], base: Path, out_dir: Path, settings: SignalSettings, *, arm: str,
    enable_thinking: bool, tracking: Any = None,
) -> dict[str, Any]:
    """Fine-tune `base` on `rows` (full batch, constant lr; each faulty prefix ``faulty_repeats`` times) until the
    model follows one of the two scripted paths (gold trace or faulty prefix; probabilities of sampling them
    exactly at T=1, summed per task, averaged over tasks) with probability ``target_path_prob``; write the HF
    checkpoint to `out_dir`. Returns the SFT's curve and where it stopped. `tracking`: where each step goes live."""
    from predict.train.sft import load_tokenizer, render_messages
    from predict.train.tracking import RunTracker
    from predict.train.trainer import Trainer

    tokenizer = load_tokenizer(base)
    rendered = [(r["role"], render_messages(r["messages"], tokenizer, enable_thinking=enable_thinking,
                                            task_id=r["task_id"])) for r in rows]
    samples = [s for role, s in rendered for _ in range(settings.faulty_repeats if role == "faulty" else 1)]
    gold = [s for role, s in rendered if role == "gold"]
    faulty = [s for role, s in rendered if role == "faulty"]
    trainer = Trainer(base, lr=settings.sft_lr, dtype="float32", device="cpu", micro_batch_tokens=8192, seed=0,
                      weight_decay=0.0, grad_clip=1.0)
    curve: list[dict[str, Any]] = []
    path = 0.0
    tracker = RunTracker(tracking, stage="sft", run=arm, config=asdict(settings)).start(0)
    for step in range(1, settings.sft_max_steps + 1):
        m = trainer.step(samples)
        p_gold, p_faulty = (sum(trace_probs(trainer, probe)) / len(probe) for probe in (gold, faulty))
        path = p_gold + p_faulty
        curve.append({"arm": arm, "step": step, "loss": m["loss"], "trace_prob": p_gold, "faulty_prob": p_faulty})
        tracker.log(curve[-1], step)
        log.info("SFT arm %s step %d: loss %.4f, gold trace %.3f, faulty prefix %.3f", arm, step, m["loss"],
                 p_gold, p_faulty)
        if path >= settings.target_path_prob:
            break
    else:
        tracker.close()
        raise RuntimeError(
            f"SFT arm {arm}: the scripted paths' probability {path:.3f} after {settings.sft_max_steps} steps, "
            f"target {settings.target_path_prob} (raise sft_max_steps or sft_lr)"
        )
    tracker.close()
    trainer.save_checkpoint(out_dir)
    return {"arm": arm, "steps": len(curve), "trace_prob": curve[-1]["trace_prob"], "path_prob": path, "curve": curve}


# ---------------------------------------------------------------------------------------------------------------
# RL runs and their curves
# ---------------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class SignalRun:
    name: str
    """Folder and label, e.g. ``A-seed1``, ``A-lr0``, ``B-alpha1``."""
    run: str
    """The study's run name `run_rl` resolves (``A``, ``B``, ``alpha0``)."""
    arm: str
    seed: int
    lr: float
    alpha: float | None
    steps: int
    group_size: int


def signal_runs(settings: SignalSettings) -> list[SignalRun]:
    first = settings.seeds[0]
    a = (settings.rl_steps, settings.group_size)
    b = (settings.label_steps, settings.label_group_size)
    runs = [SignalRun(f"A-seed{s}", "A", "A", s, settings.rl_lr, None, *a) for s in settings.seeds]
    runs.append(SignalRun("A-lr0", "A", "A", first, 0.0, None, *a))
    runs.append(SignalRun("B-alpha1", "B", "B", first, settings.rl_lr, 1.0, *b))
    runs.append(SignalRun("B-alpha0", "alpha0", "B", first, settings.rl_lr, 0.0, *b))
    return runs


def run_config(config: StageSettings, settings: SignalSettings, run: SignalRun) -> StageSettings:
    """The study config (the signal stage's typed object) with the signal run's RL design for `run`: every task
    every step, a checkpoint every step, the signal run's budget."""
    from predict.config.models import AblationSettings

    rl = config.rl.model_copy(update={
        "steps": run.steps,
        "group_size": run.group_size,
        "tasks_per_step": settings.n_tasks,
        "checkpoint_every": 1,
        "state_every": run.steps,
        "lr": run.lr,
        "max_tokens": settings.max_tokens,
        "skip_zero_advantage": False,
    })
    # Every rollout of a step in flight at once: vLLM-CPU's throughput grows ~10x from 1 to 16 concurrent requests.
    env = config.env.model_copy(update={"concurrency": settings.n_tasks * run.group_size, "budget": settings.budget})
    arms = {**config.arms, "B": config.arms["B"].model_copy(update={"alpha": 1.0})}
    ablations = {**config.ablations, "alpha0": AblationSettings(base_arm="B", alpha=0.0)}
    return config.model_copy(update={"rl": rl, "env": env, "arms": arms, "ablations": ablations})


def label_points(run_dirs: Sequence[Path], tokenizer: Any) -> list[Any]:
    """CE samples (alpha 1) of every prediction point with a verified label the runs recorded: the label
    log-prob's fixed probe set."""
    from predict.train.from_rollouts import SampleSettings, build_samples

    settings = SampleSettings(predictive=True, alpha=1.0)
    points = []
    for run_dir in run_dirs:
        for path in sorted((run_dir / ".work" / "rollouts").glob("step*.parquet")):
            samples, _, _ = build_samples(pq.read_table(path).to_pylist(), tokenizer, settings)
            points += [s for s in samples if s.kind == "ce"]
    return points


def label_logprob_curve(checkpoints: Sequence[Path], points: Sequence[Any]) -> list[float | None]:
    """Mean over `points` of the verified label's log-prob (summed over its tokens) under each checkpoint."""
    from predict.train.trainer import Trainer

    curve: list[float | None] = []
    for ckpt in checkpoints:
        if not points:
            curve.append(None)
            continue
        trainer = Trainer(ckpt, lr=0.0, dtype="float32", device="cpu", micro_batch_tokens=8192, weight_decay=0.0,
                          grad_clip=1.0, seed=0)
        lps = trainer.token_logprobs(points, weighted_only=True)
        curve.append(sum(sum(lp) for lp in lps) / len(points))
    return curve


def end_rise(values: Sequence[float | None], k: int) -> tuple[float, float, float]:
    """(mean of the first k, mean of the last k, their difference); None counts as 0 (a step with no reward)."""
    v = [0.0 if x is None else float(x) for x in values]
    if len(v) < 2 * k:
        raise ValueError(f"{len(v)} steps cannot give two disjoint ends of {k}")
    first, last = sum(v[:k]) / k, sum(v[-k:]) / k
    return first, last, last - first


def verdicts(curves: Sequence[Mapping[str, Any]], settings: SignalSettings) -> list[dict[str, Any]]:
    """One row per check (the module doc's rule, docs/learning-signal.md says why): the mean over the seeds of Arm
    A's reward rise must reach the margin; every seed's rise must exceed the lr-0 control's; the control's must stay
    below the margin; alpha 1 must raise the label log-prob by the label margin more than alpha 0."""
    by_run: dict[str, list[Mapping[str, Any]]] = {}
    for row in curves:
        by_run.setdefault(row["name"], []).append(row)
    by_run = {name: sorted(rows, key=lambda r: r["step"]) for name, rows in by_run.items()}
    ends = {name: end_rise([r["reward_mean"] for r in rows if r["step"] >= 1], settings.k)
            for name, rows in by_run.items() if rows[0]["arm"] == "A"}
    controls = [name for name in ends if by_run[name][0]["lr"] == 0]
    seeds = [name for name in ends if name not in controls]
    out: list[dict[str, Any]] = []
    if seeds:
        first, last, rise = (sum(ends[n][i] for n in seeds) / len(seeds) for i in range(3))
        out.append({
            "check": "reward rise, mean over the seeds", "first": first, "last": last, "rise": rise,
            "margin": settings.reward_margin, "expected": "at least margin", "holds": rise >= settings.reward_margin,
        })
    control_rise = max((ends[n][2] for n in controls), default=None)
    for name in seeds:
        first, last, rise = ends[name]
        if control_rise is None:
            continue
        out.append({
            "check": f"reward rise, {name}", "first": first, "last": last, "rise": rise, "margin": control_rise,
            "expected": "above the control", "holds": rise > control_rise,
        })
    for name in controls:
        first, last, rise = ends[name]
        out.append({
            "check": f"reward rise, {name}", "first": first, "last": last, "rise": rise,
            "margin": settings.reward_margin, "expected": "below margin", "holds": rise < settings.reward_margin,
        })
    lp = {name: [r["label_logprob"] for r in rows] for name, rows in by_run.items() if rows[0]["arm"] == "B"}
    if {"B-alpha1", "B-alpha0"} <= set(lp):
        one, zero = lp["B-alpha1"], lp["B-alpha0"]
        gap = (one[-1] - one[0]) - (zero[-1] - zero[0])
        out.append({
            "check": "label log-prob rise, alpha 1 minus alpha 0",
            "first": one[0], "last": one[-1], "rise": gap, "margin": settings.label_margin,
            "expected": "at least margin", "holds": gap >= settings.label_margin,
        })
    return out


CURVE_SCHEMA = pa.schema([
    ("name", pa.string()), ("run", pa.string()), ("arm", pa.string()), ("seed", pa.int64()), ("lr", pa.float64()),
    ("alpha", pa.float64()), ("step", pa.int64()), ("reward_mean", pa.float64()), ("n_rollouts", pa.int64()),
    ("label_logprob", pa.float64()), ("n_label_points", pa.int64()), ("note", pa.string()),
])
"""``curves.parquet``: a row per run and step. ``reward_mean``: mean reward of the step's rollouts (sampled at
T=1 by the weights before the step's update; step 0 has none); ``label_logprob``: Arm B, the mean log-prob of the
verified label at the fixed probe set of prediction points under the weights after ``step`` updates (step 0 = the
SFT start point)."""

VERDICT_SCHEMA = pa.schema([
    ("check", pa.string()), ("first", pa.float64()), ("last", pa.float64()), ("rise", pa.float64()),
    ("margin", pa.float64()), ("expected", pa.string()), ("holds", pa.bool_()),
])
"""``verdicts.parquet``: a row per check; ``rise`` = last - first (the mean over the seeds for the mean's check; for
the label check: alpha 1's rise minus alpha 0's), ``margin`` what it is held against (a seed's check: the control's
rise), ``holds``: the check's expectation against ``margin`` is met."""


def plot(curves: Sequence[Mapping[str, Any]], path: Path) -> Path:
    """Reward per step (Arm A runs and both Arm B runs) and the label log-prob, alpha 1 vs 0, side by side."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    fig, (ax_r, ax_l) = plt.subplots(1, 2, figsize=(11, 4))
    names = list(dict.fromkeys(r["name"] for r in curves))
    for name in names:
        rows = sorted((r for r in curves if r["name"] == name), key=lambda r: r["step"])
        steps = [r["step"] for r in rows if r["reward_mean"] is not None]
        ax_r.plot(steps, [r["reward_mean"] for r in rows if r["reward_mean"] is not None], marker="o", label=name)
        if rows[0]["arm"] == "B":
            pts = [(r["step"], r["label_logprob"]) for r in rows if r["label_logprob"] is not None]
            ax_l.plot(*zip(*pts, strict=True), marker="o", label=name)
    ax_r.set(xlabel="RL step", ylabel="mean reward (T=1)", title="reward per step", ylim=(-0.05, 1.05))
    ax_l.set(xlabel="RL step (0 = SFT start)", ylabel="log p(verified label)", title="Arm B label log-prob")
    for ax in (ax_r, ax_l):
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # steps are whole numbers
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
    fig.suptitle("learning signal (" + SANITY_NOTE.split(":")[0] + ": RL on the SFT tasks)", fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def run_signal(
    config: StageSettings | Mapping[str, Any], out_dir: str | Path, settings: SignalSettings | None = None, *,
    tracking: Any = None,
) -> dict:
    """The whole signal run into `out_dir`; returns {"curves", "verdicts", "sft", "passed", "wall_s"}.
    `tracking` (`predict.train.tracking.TrackingTargets`): its SFT and RL steps go live under ``signal/``.
    `config`: the stage's typed object, or any config mapping (tests), read through the signal's row."""
    import torch

    from predict.campaign import seal_task_ids
    from predict.data import MBPP_SCHEMA, load_mbpp, split_tasks
    from predict.outputs import write_rows
    from predict.serving.server import VLLMServer, default_cache_dir
    from predict.stages import StageSettings, stage_settings
    from predict.tiny_model import cached_tiny_qwen3
    from predict.traces.stage import run_stage
    from predict.train.rl import SERVED_NAME, RLJob, run_rl
    from predict.train.sft import load_tokenizer

    settings = settings or SignalSettings()
    view = config if isinstance(config, StageSettings) else stage_settings("signal", config)
    out = Path(out_dir)
    t0 = time.perf_counter()
    # A guard, not a measured speed-up: subnormal floats (AdamW's second moments of rarely seen rows can decay into
    # them) are many times slower on x86 CPUs; flushing values below 1e-38 to zero changes nothing that matters.
    # (SFT step times on the shared 2-core box varied 1.5-10 s with the other jobs' load, with and without it.)
    torch.set_flush_denormal(True)
    data = view.data
    rows = load_mbpp(data.mbpp_path, hf_fallback=data.hf_fallback, sha256=data.mbpp_sha256)
    sft_split = split_tasks(rows, data.split_seed, data.sizes)["sft"]
    # its tasks come from no file the stage table could name: sealed here, before anything is written
    seal_task_ids([r["task_id"] for r in sft_split], data, source=f"the sft split of {data.mbpp_path}",
                  stage="signal")
    run_stage(sft_split, view, out / "traces", progress=False)

    base = Path(cached_tiny_qwen3(default_cache_dir() / "models", seed=0, hidden_size=settings.hidden_size,
                                  num_layers=settings.num_layers))
    tokenizer = load_tokenizer(base)
    thinking = view.model.enable_thinking
    chosen = pick_tasks(out / "traces", tokenizer, settings.n_tasks, enable_thinking=thinking)
    chosen = {arm: at_budget(rows, view, arm, settings.budget) for arm, rows in chosen.items()}
    task_ids = sorted({r["task_id"] for r in chosen["A"]})
    tasks = write_rows([{k: r[k] for k in MBPP_SCHEMA.names} for r in sft_split if r["task_id"] in task_ids],
                       MBPP_SCHEMA, out / "tasks.parquet")
    # Arm B's start point goes on from Arm A's: the same tasks and patches, so it only has the predictive format's
    # prompt and prediction turn to learn (about half the SFT steps of a start from the base model: docs/learning-signal.md).
    live = tracking.under("signal") if tracking is not None else None
    sft = {"A": sft_start_point(chosen["A"], base, out / "sft" / "A", settings, arm="A", enable_thinking=thinking,
                                tracking=live)}
    sft["B"] = sft_start_point(chosen["B"], out / "sft" / "A", out / "sft" / "B", settings, arm="B",
                               enable_thinking=thinking, tracking=live)

    runs = signal_runs(settings)
    with VLLMServer.from_serving(out / "sft" / "A", view.serving, sequences=view.env.concurrency,
                                 served_model_name=SERVED_NAME,
                                 worker_extension=True, log_path=out / "vllm.log") as server:
        for r in runs:
            # under the signal run's own name: A-seed1 and A-lr0 are both run A, seed 1
            job = RLJob(run=r.run, seed=r.seed, init=out / "sft" / r.arm, tasks=tasks, out_dir=out / "rl" / r.name,
                        tracking=live.under(r.name) if live is not None else None)
            run_rl(job, run_config(view, settings, r), server=server)

    points = label_points([out / "rl" / r.name for r in runs if r.arm == "B"], tokenizer)
    curves: list[dict[str, Any]] = []
    for r in runs:
        run_dir = out / "rl" / r.name
        metrics = {m["step"]: m for m in pq.read_table(run_dir / "metrics.parquet").to_pylist()}
        lp: list[float | None] = [None] * (r.steps + 1)
        if r.arm == "B":
            ckpts = [out / "sft" / "B", *(run_dir / f"step{s}" for s in range(1, r.steps + 1))]
            lp = label_logprob_curve(ckpts, points)
        for step in range(r.steps + 1):
            m = metrics.get(step, {})
            curves.append({
                "name": r.name, "run": r.run, "arm": r.arm, "seed": r.seed, "lr": r.lr, "alpha": r.alpha,
                "step": step, "reward_mean": m.get("reward_mean"), "n_rollouts": m.get("n_rollouts"),
                "label_logprob": lp[step], "n_label_points": len(points) if r.arm == "B" else None,
                "note": SANITY_NOTE,
            })
    checks = verdicts(curves, settings)
    meta = {"settings": asdict(settings), "tasks": task_ids, "note": SANITY_NOTE,
            "sft": {a: {k: v for k, v in s.items() if k != "curve"} for a, s in sft.items()}}
    write_table(pa.Table.from_pylist(curves, schema=CURVE_SCHEMA), out / "curves.parquet",
                metadata={"predict.signal": json.dumps(meta)})
    write_table(pa.Table.from_pylist(checks, schema=VERDICT_SCHEMA), out / "verdicts.parquet")
    write_table(pa.Table.from_pylist([row for s in sft.values() for row in s["curve"]]), out / "sft_curve.parquet")
    plot(curves, out / "signal.png")
    return {"curves": curves, "verdicts": checks, "sft": sft, "tasks": task_ids,
            "passed": all(c["holds"] for c in checks), "wall_s": time.perf_counter() - t0,
            "grad_terms": grad_term_rows(out, runs)}


def print_curves(result: Mapping[str, Any], console: Any) -> None:
    """The curves and verdicts as tables: reward per step of every run, label log-prob of alpha 1 vs 0."""
    from rich.table import Table

    curves = result["curves"]
    names = list(dict.fromkeys(r["name"] for r in curves))
    steps = sorted({r["step"] for r in curves})
    cell = {(r["name"], r["step"]): r for r in curves}

    def fmt(name: str, step: int, column: str, spec: str) -> str:
        v = cell.get((name, step), {}).get(column)  # Arm B's runs are shorter than Arm A's
        return "-" if v is None else format(v, spec)

    table = Table("run", *(str(s) for s in steps if s >= 1), title="mean reward per RL step (T=1; n per step in "
                  "curves.parquet)")
    for name in names:
        table.add_row(name, *(fmt(name, s, "reward_mean", ".2f") for s in steps if s >= 1))
    console.print(table)
    table = Table("run", *(str(s) for s in steps), title="Arm B: log p(verified label) after N steps (0 = SFT)")
    for name in names:
        if cell[name, 0]["arm"] == "B":
            table.add_row(name, *(fmt(name, s, "label_logprob", ".3f") for s in steps))
    console.print(table)
    table = Table("check", "first", "last", "rise", "margin", "expected", "holds", title="verdicts")
    for c in result["verdicts"]:
        table.add_row(c["check"], f"{c['first']:.3f}", f"{c['last']:.3f}", f"{c['rise']:+.3f}", f"{c['margin']:.2f}",
                      c["expected"], "yes" if c["holds"] else "NO")
    console.print(table)
    print_grad_terms(result, console)


# ---------------------------------------------------------------------------------------------------------------
# Gradient interference (issue 28, `predict.train.grad_terms`): the RL and CE terms' gradient norms of Arm B's runs
# ---------------------------------------------------------------------------------------------------------------
def grad_term_rows(out: Path, runs: Sequence[SignalRun]) -> list[dict[str, Any]]:
    """Per Arm B run (alpha 1, alpha 0) and step: the RL and CE terms' gradient norms and their cosine, as the
    run's metrics.parquet has them."""
    from predict.train.step_metrics import GRAD_TERM_COLUMNS, read_metrics

    return [{"name": r.name, "alpha": r.alpha, "step": m["step"], **{c: m.get(c) for c in GRAD_TERM_COLUMNS}}
            for r in runs if r.arm == "B" for m in read_metrics(out / "rl" / r.name / "metrics.parquet")]


def print_grad_terms(result: Mapping[str, Any], console: Any) -> None:
    """The norms and cosine of alpha 1 and alpha 0, a row per run and step (nothing when the run has none)."""
    from rich.table import Table

    rows = result.get("grad_terms") or []
    if not rows:
        return

    def num(v: float | None, spec: str) -> str:
        return "-" if v is None else format(v, spec)

    table = Table("run", "alpha", "step", "RL grad norm", "CE grad norm", "CE / RL", "cosine",
                  title="Arm B: the RL and CE terms' gradient norms (before clipping) and their cosine")
    for r in rows:
        rl, ce = r["rl_grad_norm"], r["ce_grad_norm"]
        ratio = ce / rl if rl and ce is not None else None
        table.add_row(r["name"], num(r["alpha"], "g"), str(r["step"]), num(rl, ".4g"), num(ce, ".4g"),
                      num(ratio, ".3g"), num(r["rl_ce_grad_cosine"], "+.4f"))
    console.print(table)


# `predict signal`: its flags override SignalSettings (None: the settings' own value)
def arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out-dir", required=True, help="curves.parquet, verdicts.parquet, signal.png and the runs")
    p.add_argument("--seeds", type=int, nargs="+", default=None, help="Arm A seeds (default 1 2)")
    p.add_argument("--rl-steps", type=int, default=None, help="Arm A's RL steps")
    p.add_argument("--label-steps", type=int, default=None, help="Arm B's RL steps (alpha 1 and alpha 0)")
    p.add_argument("--rl-lr", type=float, default=None)
    p.add_argument("--group-size", type=int, default=None)
    p.add_argument("--n-tasks", type=int, default=None)
    p.add_argument("--k", type=int, default=None, help="steps averaged at each end of the reward curve")
    p.add_argument("--target-path-prob", type=float, default=None,
                   help="SFT stops when the gold trace or the faulty prefix is sampled with this probability")


def main(args: argparse.Namespace, config: StageSettings) -> int:
    from predict.outputs import console
    from predict.train.tracking import TrackingTargets

    overrides = {k: v for k, v in {
        "seeds": tuple(args.seeds) if args.seeds else None, "rl_steps": args.rl_steps, "rl_lr": args.rl_lr,
        "group_size": args.group_size, "n_tasks": args.n_tasks, "k": args.k, "target_path_prob": args.target_path_prob,
        "label_steps": args.label_steps,
    }.items() if v is not None}
    settings = SignalSettings(**overrides)
    result = run_signal(config, Path(args.out_dir), settings, tracking=TrackingTargets.from_config(config))
    print_curves(result, console)
    console.print(f"{SANITY_NOTE}; {result['wall_s']:.0f} s; figure: {Path(args.out_dir) / 'signal.png'}")
    if not result["passed"]:  # a finding, not a failed stage: the verdicts are written (and a test asserts them)
        console.print("[red]the learning signal does not hold[/red] (verdicts.parquet)")
    return 0
