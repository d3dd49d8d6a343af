"""The per-step metrics schema (`predict.train.step_metrics`) through its real writers: the local trainers' rollout
counting, prime-rl's metrics.jsonl through the converter, and the report and training-outcome table that read it.

prime-rl's metrics.jsonl is written here as prime-rl v0.8.0 writes it (read from its source,
../shared/vendor/prime-rl-60bc2954.tar.gz): `utils/monitor/file.py` appends one JSON object per `monitor.log` call,
``{"step": N, "time": t, **metrics}``; the orchestrator logs one per step (`orchestrator.py`, the train batch:
``train/{agg,<env>}/{all,effective}/<agent>/...`` from `metrics.py`'s `TrainMetrics.to_wandb`, where a trace
metric recorded by `PredictAlgorithm` appears as ``.../<agent>/metrics/<name>/{mean,max,min,p10,p90}`` over the
rollouts carrying it, errored traces as ``.../<agent>/error/<type>`` counts on ``all``, plus ``progress/rollouts``,
``progress/{input,output}_tokens`` and ``time/step``); the trainer logs several objects per step (``loss/mean``,
``optim/lr``, ``optim/grad_norm``, ...) into its own file. A retried attempt appends the same steps again.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from predict.cli import main
from predict.config import load_config
from predict.env.protocol import Episode, ProtocolConfig, edit_reply
from predict.train.prime_rl.collect import schema_rows, write_rl_metrics
from predict.train.step_metrics import (
    METRIC_COLUMNS,
    MetricsSchemaError,
    read_metrics,
    rollout_metrics,
    rollout_trace_metrics,
    write_metrics,
)

from .conftest import REPO
from .synthetic import FAIL_KEEP, FAIL_REVISE, PASS_KEEP, PASS_REVISE, rollout
from .test_env_extensions import ADD_PATCH, GOOD, STUB_LINE, TEST
from .test_env_protocol import FakeTests, predict

AGENT = "predict_local_agent"
LOCAL_TIMES = {"rollout_s": 2.0, "samples_s": 0.1, "update_s": 1.0, "sync_s": 0.5, "step_s": 4.0}
"""The time split `predict rl` logs per step (seconds)."""
PRIME_RL_TIMES = {"time/step": 3.5, "time/broadcast_weights": 0.25, "time/forward_backward": 1.5}
"""prime-rl's timings of a step: the orchestrator's time/step, the trainer's broadcast and forward-backward."""
SCRIPTS = [[PASS_KEEP], [FAIL_REVISE, PASS_KEEP], [FAIL_KEEP], [PASS_REVISE, FAIL_KEEP], [FAIL_REVISE, FAIL_REVISE]]


def step_records(step: int, arm: str = "B") -> list[dict[str, Any]]:
    """A step's rollouts: the real record schema, played through the protocol (tests/synthetic.py)."""
    return [rollout(100 * step + i, s, arm=arm, checkpoint=f"rl-step{step}") for i, s in enumerate(SCRIPTS[: 2 + step])]


def local_rows(run: str, seed: int, steps: int = 3, arm: str = "B") -> list[dict[str, Any]]:
    """What `predict rl` logs for its rollouts: the driver's row identity plus `rollout_metrics` of each step."""
    return [{"run": run, "seed": seed, "step": s, "backend": "rl", **rollout_metrics(step_records(s, arm)),
             "loss": 1.0 / s, "updated": True, **LOCAL_TIMES} for s in range(1, steps + 1)]


def prime_rl_output(tmp: Path, steps: int = 3, retried: int | None = 2) -> Path:
    """prime-rl's output_dir after a run of Arm B: both metrics.jsonl files, as prime-rl writes them."""
    out = tmp / "prime-rl"
    (out / "run_default").mkdir(parents=True)
    orch, trainer = [], []
    for step in range(1, steps + 1):
        records = step_records(step)
        per_rollout = [rollout_trace_metrics({"agent_result": {"steps": r["steps"],
                                                               "summary": {"budget_exhausted": r["budget_exhausted"]}},
                                              "final_verdict": {"outcome": r["final_outcome"]}}, r["reward"])
                       for r in records]
        line: dict[str, Any] = {"step": step, "time": 1000.0 + step, "progress/rollouts": len(records) + 1,
                                "progress/input_tokens": 100 * step, "progress/output_tokens": 10 * step,
                                "time/step": PRIME_RL_TIMES["time/step"], f"train/agg/all/{AGENT}/error/Cancelled": 1.0,
                                f"train/agg/all/{AGENT}/reward/mean": 0.4}
        for name in per_rollout[0]:
            values = [m[name] for m in per_rollout]
            prefix = f"train/agg/all/{AGENT}/metrics/{name}"
            line |= {f"{prefix}/mean": sum(values) / len(values), f"{prefix}/max": max(values),
                     f"{prefix}/min": min(values)}
            line[f"train/agg/effective/{AGENT}/metrics/{name}/mean"] = values[0]  # another subset: not read
        orch.append(line)
        trainer += [{"step": step, "time": 1.0, "loss/mean": 0.5 / step, "entropy/all/mean": 2.0},
                    {"step": step, "time": 1.0, "optim/lr": 1e-6, "optim/grad_norm": 0.3, "optim/zero_grad_ratio": 0},
                    {"step": step, "time": 1.0, "time/step": 9.0, "time/wait_for_batch": 0.1, "time/load_data": 0.1,
                     "time/broadcast_weights": PRIME_RL_TIMES["time/broadcast_weights"], "time/save_ckpt": 0.0,
                     "time/forward_backward": PRIME_RL_TIMES["time/forward_backward"]}]  # train.py's time_metrics
    if retried is not None:  # a retried attempt re-logs a step: first a stale value, then the one that counts
        orch.insert(retried - 1, {**orch[retried - 1], "progress/rollouts": 999})
    (out / "run_default" / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in orch) + '{"step": 9, "ti')
    (out / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in trainer))
    return out


# ---------------------------------------------------------------------------------------------------------------
def test_an_edit_on_revise_replacement_counts_as_a_patch_with_its_prediction() -> None:
    """issue 16 item 7: rl.py counted only apply_patch steps and missed the REVISE reply's replacement patch."""
    ep = Episode(ProtocolConfig.resolve("predictive", "edit_on_revise"), FakeTests())  # type: ignore[arg-type]
    for reply in [ADD_PATCH, edit_reply("ASSERTION_FAILURE", STUB_LINE, GOOD), predict("PASS", "KEEP"), TEST, "FINAL"]:
        ep.step(reply)
    record = {"ok": True, "reward": 1.0, "final_pass": True, "steps": [s.to_dict() for s in ep.steps]}
    m = rollout_metrics([record])
    assert (m["n_patches"], m["n_predictions"], m["n_revise"]) == (2, 2, 1)
    assert (m["pred_ASSERTION_FAILURE"], m["pred_PASS"]) == (1, 1)
    assert (m["verified_ASSERTION_FAILURE"], m["verified_PASS"]) == (1, 1)
    assert m["revise_rate"] == 0.5 and m["prediction_accuracy"] == 1.0


def test_the_schema_refuses_a_column_no_trainer_declares(tmp_path: Path) -> None:
    with pytest.raises(MetricsSchemaError, match=r"step 1.*undeclared column\(s\) \['reward'\]"):
        write_metrics([{"run": "B", "seed": 42, "step": 1, "backend": "rl", "reward": 0.3}], tmp_path / "m.parquet")
    path = write_metrics(local_rows("B", 42), tmp_path / "m.parquet")
    assert pq.read_schema(path).names == list(METRIC_COLUMNS)
    assert [r["step"] for r in read_metrics(path)] == [1, 2, 3]


def test_prime_rl_metrics_convert_to_the_same_counts_as_the_local_trainer(tmp_path: Path) -> None:
    out = prime_rl_output(tmp_path)
    schema, raw = tmp_path / "metrics.parquet", tmp_path / "prime-rl-metrics.parquet"
    assert write_rl_metrics(out, schema, raw, run="B", seed=42) == 3
    rows, local = read_metrics(schema), local_rows("B", 42)
    assert [r["step"] for r in rows] == [1, 2, 3] and {r["backend"] for r in rows} == {"prime_rl"}
    same = [c for c in METRIC_COLUMNS if c.startswith(("pred_", "verified_", "n_patches", "n_predictions", "n_revise"))]
    for mine, theirs in zip(rows, local, strict=True):
        assert {c: mine[c] for c in same} == {c: theirs[c] for c in same}
        for rate in ("reward_mean", "pass_rate", "revise_rate", "prediction_accuracy", "budget_exhausted_rate"):
            assert mine[rate] == pytest.approx(theirs[rate]), rate
        assert mine["n_rollouts"] == theirs["n_rollouts"] + 1 and mine["n_failed"] == 1  # the retried step: last
    assert (rows[0]["loss"], rows[0]["grad_norm"], rows[0]["lr"], rows[0]["n_input_tokens"]) == (0.5, 0.3, 1e-6, 100)
    # prime-rl's timings in the local trainer's columns: the orchestrator's step (not the trainer's), its broadcast
    assert all((r["step_s"], r["sync_s"], r["update_s"], r["rollout_s"]) == (3.5, 0.25, 1.5, None) for r in rows)
    long = pq.read_table(raw).to_pylist()  # prime-rl's own, every line kept (the torn last one skipped)
    assert {r["source"] for r in long} == {"orchestrator", "trainer"} and any(r["value"] == 999 for r in long)


def test_a_prime_rl_run_without_trace_metrics_still_has_curves(tmp_path: Path) -> None:
    out = prime_rl_output(tmp_path, retried=None)
    lines = [json.loads(x) for x in (out / "run_default" / "metrics.jsonl").read_text().splitlines()[:-1]]
    lines = [{k: v for k, v in x.items() if "/metrics/" not in k} for x in lines]  # e.g. prime-rl's own grpo
    (out / "run_default" / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    from predict.train.prime_rl.collect import metrics_table

    rows = schema_rows(metrics_table(out), "A", 42)
    assert [(r["reward_mean"], r["pass_rate"]) for r in rows] == [(0.4, 0.4)] * 3
    assert not any(k.startswith("pred_") for r in rows for k in r)


def test_report_and_training_outcomes_from_both_backends(tmp_path: Path) -> None:
    """Each real writer -> `predict training-outcomes` -> `predict report`: curves and class shares for both."""
    local = write_metrics(local_rows("B", 42), tmp_path / "rl" / "B" / "seed42" / "metrics.parquet")
    reactive = write_metrics(local_rows("A", 42, arm="A"), tmp_path / "rl" / "A" / "seed42" / "metrics.parquet")
    cluster = tmp_path / "rl" / "B" / "seed43" / "metrics.parquet"
    write_rl_metrics(prime_rl_output(tmp_path), cluster, tmp_path / "raw.parquet", run="B", seed=43)
    rft = [{**r, "run": "rft_B", "backend": "rft"} for r in local_rows("rft_B", 42)]  # the SFT policy's rollouts
    rft_path = write_metrics(rft, tmp_path / "rl" / "rft_B" / "seed42" / "metrics.parquet")
    outcomes = tmp_path / "stats" / "training_outcomes.parquet"
    paths = [str(p) for p in (local, reactive, cluster, rft_path)]
    (tmp_path / "none.json").write_text("{}")  # the stage's slice: it reads no config
    assert main(["training-outcomes", "--config-slice", str(tmp_path / "none.json"), "--rl-metrics", *paths,
                 "--out", str(outcomes)]) == 0
    rows = pq.read_table(outcomes).to_pylist()
    # the reactive arm predicts nothing; RFT's sampled rollouts are not RL steps
    assert {(r["run"], r["seed"]) for r in rows} == {("B", 42), ("B", 43)}
    for seed in (42, 43):
        mine = {r["cls"]: r for r in rows if r["seed"] == seed}
        # steps of 3, 4, 5 rollouts (SCRIPTS): 4 + 6 + 8 patches; predicted PASS 3 + 4 + 4, verified PASS 2 + 3 + 3
        assert mine["PASS"]["n_verified_total"] == mine["PASS"]["n_predicted_total"] == 18
        assert (mine["PASS"]["n_predicted"], mine["ASSERTION_FAILURE"]["n_predicted"]) == (11, 7)
        assert (mine["PASS"]["n_verified"], mine["ASSERTION_FAILURE"]["n_verified"]) == (8, 10)
        assert mine["PASS"]["verified_share"] == pytest.approx(8 / 18) and mine["MALFORMED"]["n_verified"] is None
    config = json.dumps(load_config(REPO / "config" / "local.yaml"))
    html = tmp_path / "index.html"
    assert main(["report", "--config-json", config, "--stats-dir", str(tmp_path / "none"), "--power",
                 str(tmp_path / "none.parquet"), "--rl-metrics", *paths, "--training-outcomes", str(outcomes),
                 "--out", str(html)]) == 0
    page = html.read_text()
    training = page.split('id="training"')[1].split("</section>")[0]
    assert 'alt="training curves"' in training and "No RL metrics yet for" in training  # other runs missing
    share = page.split('id="training-outcomes"')[1].split("</section>")[0]
    assert "B, seed 42</b>: 18 verified outcomes and 18 predictions over 3 RL steps" in share
    assert "B, seed 43</b>: 18 verified outcomes" in share and "share of predictions" in share and "<img" in share
    # where each run's step time goes: the local backend's three parts + the rest; prime-rl's (no rollout part)
    assert 'alt="step time split"' in training
    body = training.split("<tbody>")[1].split("</tbody>")[0]
    cells = [re.findall(r"<td[^>]*>(.*?)</td>", row) for row in body.split("</tr>")[:-1]]
    assert [c[0] for c in cells] == ["A/seed42", "B/seed42", "B/seed43", "rft_B/seed42"]
    assert cells[1][1:] == ["2.000", "1.000", "0.500", "0.500", "4.000"]  # rollout, update, sync, other, step
    assert cells[2][1:] == ["–", "1.500", "0.250", "1.750", "3.500"]
