"""The extensions of issue #11 as runs: resolution (`predict.runs`), what reaches rollouts and evaluation, RFT's
samples and batches, the extension tables (`predict.stats.extension_table`) on synthetic records, and the
`predict extensions` stage. The environment rules of each variant (test costs, chained revisions) are pinned in
test_env_extensions.py, the decision mask in test_rl_samples.py, the RFT and RL stages end to end in test_rft.py."""

from __future__ import annotations

import copy
import json
import math
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from predict.campaign import select_checkpoints
from predict.cli import main
from predict.config import ConfigError, load_config
from predict.runs import extension_counterpart, resolve_run, runs_of_kind, study_runs
from predict.stats import extension_table

from .conftest import REPO
from .synthetic import FAIL_KEEP, FAIL_REVISE, PASS_KEEP, PASS_REVISE, extension_spec, rollout, write_eval

EXTENSIONS = ["expensive_tests_A", "expensive_tests_B", "edit_on_revise", "mask_decision", "rft_A", "rft_B",
              "irreversible_A", "irreversible_B", "blind_A", "blind_B"]


@pytest.mark.parametrize("name", ["config.yaml", "local.yaml"])
def test_every_extension_resolves_to_what_it_changes(name: str) -> None:
    config = load_config(REPO / "config" / name)
    assert study_runs(config) == ["A", "B", "alpha0", "forced_keep", "budget_neutral", *EXTENSIONS]
    assert runs_of_kind(config, "extension") == EXTENSIONS
    assert runs_of_kind(config, "extension", trainer="rft") == ["rft_A", "rft_B"]
    got = {r: resolve_run(config, r) for r in EXTENSIONS}
    own = name == "config.yaml"  # the paper's open-question runs train from their own SFT; locally from the arm's
    assert [(s.arm, s.test_cost, s.variant, s.mask_decision, s.trainer, s.sft_run) for s in got.values()] == [
        ("A", 3, "none", False, "rl", "A"),
        ("B", 3, "none", False, "rl", "B"),
        ("B", 1, "edit_on_revise", False, "rl", "B"),
        ("B", 1, "none", True, "rl", "B"),
        ("A", 1, "none", False, "rft", "A"),
        ("B", 1, "none", False, "rft", "B"),
        ("A", 1, "irreversible", False, "rl", "irreversible_A" if own else "A"),
        ("B", 1, "irreversible", False, "rl", "irreversible_B" if own else "B"),
        ("A", 1, "blind", False, "rl", "blind_A" if own else "A"),
        ("B", 1, "blind", False, "rl", "blind_B" if own else "B"),
    ]
    assert [got[r].protocol for r in ("irreversible_A", "irreversible_B", "blind_A", "blind_B")] == [
        "reactive", "predictive", "reactive", "predictive"]
    assert {s.kind for s in got.values()} == {"extension"} and resolve_run(config, "alpha0").kind == "ablation"
    assert got["expensive_tests_B"].alpha == 1.0 and got["expensive_tests_A"].alpha == 0.0
    # the arms and ablations keep the study's protocol
    for run in ("A", "B", "alpha0", "forced_keep", "budget_neutral"):
        spec = resolve_run(config, run)
        assert (spec.test_cost, spec.mask_decision, spec.trainer) == (1, False, "rl"), run
    assert extension_counterpart(config, "expensive_tests_B") == "expensive_tests_A"
    assert extension_counterpart(config, "expensive_tests_A") == "expensive_tests_B"
    assert extension_counterpart(config, "edit_on_revise") is None and extension_counterpart(config, "rft_B") is None
    # an environment run is compared with the other protocol in its environment (predict.runs.environments)
    assert extension_counterpart(config, "blind_B") == "blind_A" and extension_counterpart(config, "irreversible_A") == "irreversible_B"


def test_a_run_carries_its_test_cost_into_the_config_it_rolls_out_with() -> None:
    from predict.stages import stage_settings

    config = stage_settings("evaluate", load_config(REPO / "config" / "local.yaml"))
    spec = resolve_run(config, "expensive_tests_A")
    assert spec.env(config).env.test_cost == 3 and config.env.test_cost == 1
    assert resolve_run(config, "B").env(config) is config


def test_bad_extensions_are_named() -> None:
    config = load_config(REPO / "config" / "local.yaml")
    bad = copy.deepcopy(config)
    bad["extensions"]["mask_A"] = {"base_arm": "A", "mask_decision": True}
    with pytest.raises(ConfigError, match="extensions.mask_A: mask_decision needs a predictive base arm"):
        resolve_run(bad, "mask_A")
    bad = copy.deepcopy(config)
    bad["extensions"]["edit_A"] = {"base_arm": "A", "variant": "edit_on_revise"}
    with pytest.raises(ConfigError, match="edit_A: variant edit_on_revise needs a predictive"):
        resolve_run(bad, "edit_A")
    bad = copy.deepcopy(config)
    bad["extensions"]["alpha0"] = {"base_arm": "B"}
    with pytest.raises(ConfigError, match="'alpha0' is named twice"):
        resolve_run(bad, "B")
    bad = copy.deepcopy(config)
    bad["extensions"]["x"] = {"base_arm": "C"}
    with pytest.raises(ConfigError, match="extensions.x.base_arm: no arm 'C'"):
        resolve_run(bad, "x")
    with pytest.raises(ConfigError, match="neither an arm, an ablation nor an extension"):
        resolve_run(config, "nope")


def test_evaluation_rolls_out_with_the_runs_test_cost_and_variant(monkeypatch: pytest.MonkeyPatch,
                                                                  tmp_path: Path) -> None:
    import predict.evaluate as evaluate_mod

    seen: dict[str, Any] = {}

    def fake_run_job(job: Any, config: Any) -> dict:
        seen[job.run] = (job.arm, job.variant, config.env.test_cost)
        return {}

    monkeypatch.setattr(evaluate_mod, "run_job", fake_run_job)
    config = load_config(REPO / "config" / "local.yaml")
    for run in ("expensive_tests_B", "edit_on_revise", "rft_A", "A"):
        evaluate_mod.evaluate(config, run=run, checkpoint="step2", split="val", seed=42, tasks_path=tmp_path / "t",
                              model="m", out=tmp_path / f"{run}.parquet")
    assert seen == {"expensive_tests_B": ("B", "none", 3), "edit_on_revise": ("B", "edit_on_revise", 1),
                    "rft_A": ("A", "none", 1), "A": ("A", "none", 1)}


# -- RFT sampling and batches ---------------------------------------------------------------------------------------
def test_rft_tasks_and_batches_are_seeded_and_cover_the_kept_rollouts() -> None:
    from predict.train.rft import rft_settings, rft_tasks, step_batch

    rows = [{"task_id": i} for i in range(10)]
    chosen = rft_tasks(rows, 42, 3, 2)
    assert len(chosen) == 6 and [r["sample"] for r in chosen] == [0, 1] * 3
    assert chosen == rft_tasks(rows, 42, 3, 2) and chosen != rft_tasks(rows, 43, 3, 2)
    assert len(rft_tasks(rows, 42, None, 4)) == 40
    batches = [step_batch(5, 42, s, 2) for s in (1, 2, 3)]
    assert sorted(batches[0] + batches[1] + batches[2][:1]) == list(range(5))  # one epoch visits every kept rollout
    assert step_batch(0, 42, 1, 4) == []
    config = load_config(REPO / "config" / "config.yaml")
    assert asdict(rft_settings(config)) == {"group_size": 8, "tasks": None, "batch_rollouts": 16 * 8, "lr": 1e-5}
    local = load_config(REPO / "config" / "local.yaml")
    assert asdict(rft_settings(local)) == {"group_size": 2, "tasks": 2, "batch_rollouts": 2, "lr": 1e-4}
    whole = copy.deepcopy(local) | {"rft": {"lr": 1}}  # YAML's `lr: 1` is an int; the model's field is a float
    assert type(rft_settings(whole).lr) is float and rft_settings(whole).group_size == local["rl"]["group_size"]


def test_rft_samples_keep_only_reward_1_rollouts_with_ce_on_sampled_tokens() -> None:
    from tokenizers import Tokenizer

    from predict.env.runner import default_tokenizer_dir
    from predict.train.from_rollouts import SampleCounts, rft_samples, rollout_calls
    from tests.test_rl_samples import FINAL, PATCH, PREDICT_FAIL, dec, revised_shadow_rollout

    tok = Tokenizer.from_file(str(Path(default_tokenizer_dir()) / "tokenizer.json"))
    counts = SampleCounts()
    rec = revised_shadow_rollout(tok, reward=1.0)
    (sample,) = rft_samples(rec, counts)
    calls = rollout_calls(rec["tokens"])
    sampled = [t for c in calls for t in c.positions]
    assert sample.kind == "sft" and sample.token_ids == [t for n in rec["tokens"] for t in n["token_ids"]]
    assert [t for t, w in enumerate(sample.ce_weights) if w] == sampled and set(sample.ce_weights) == {0.0, 1.0}
    assert sample.mask == [w > 0 for w in sample.ce_weights] and not any(sample.rl_weights)
    assert dec(tok, [sample.token_ids[t] for t in sampled]) == PATCH + PREDICT_FAIL + FINAL  # nothing re-tokenised
    assert [sample.logprobs[t] for t in sampled] == [lp for c in calls for lp in c.logprobs]
    assert rft_samples(revised_shadow_rollout(tok, reward=0.0), counts) == []
    assert rft_samples(revised_shadow_rollout(tok, reward=1.0, ok=False), counts) == []
    assert rft_samples({**revised_shadow_rollout(tok), "reward": None}, counts) == []
    assert (counts.rollouts, counts.no_reward) == (4, 2)


# -- extension tables ------------------------------------------------------------------------------------------------
def _evals(root: Path, run: str, arm: str, script: list, seeds=(42, 43), ckpt: str = "step2", **edit: Any) -> list:
    paths = []
    for seed in seeds:
        rows = [rollout(t, [p], arm=arm, seed=seed, checkpoint=ckpt) for t, p in enumerate(script)]
        for r in rows:
            for key, fn in edit.items():
                r[key] = fn(r)
        paths.append(str(write_eval(root, run, ckpt, seed, rows)))
    return paths


def _selection(paths: list[str]) -> list[dict]:
    from predict.stats import mechanism_metrics, read_evaluation

    metrics = [{"run": e.run, "checkpoint": e.checkpoint, "split": e.split, "seed": e.seed,
                **mechanism_metrics(e.rows)} for e in map(read_evaluation, paths)]
    return select_checkpoints(metrics, "fixed", 2)


@pytest.fixture()
def arms(tmp_path: Path) -> list[str]:
    return (_evals(tmp_path, "A", "A", [PASS_KEEP] * 6 + [FAIL_KEEP] * 4)
            + _evals(tmp_path, "B", "B", [PASS_KEEP] * 4 + [FAIL_REVISE] * 4 + [PASS_REVISE] + [FAIL_KEEP]))


def test_expensive_tests_rows_count_calls_saved_and_revise_precision(tmp_path: Path, arms: list[str]) -> None:
    ext_b = _evals(tmp_path, "expensive_tests_B", "B", [PASS_KEEP] * 5 + [FAIL_REVISE] * 3 + [PASS_REVISE] * 2,
                   calls_used=lambda r: 4 if r["final_pass"] else 9)
    ext_a = _evals(tmp_path, "expensive_tests_A", "A", [PASS_KEEP] * 6 + [FAIL_KEEP] * 4,
                   calls_used=lambda r: 7 if r["final_pass"] else 10)
    paths = arms + ext_a + ext_b
    spec = extension_spec("expensive_tests_B", "B", test_cost=3, trainer="rl", variant="none")
    rows = extension_table("expensive_tests_B", paths, _selection(paths), spec=spec, counterpart="expensive_tests_A",
                           default_test_cost=1, resamples=200, seed=0, ci=0.95).to_pylist()
    assert [r["seed"] for r in rows] == [42, 43]
    r = rows[0]
    assert (r["mechanism"], r["focus_metric"], r["test_cost"], r["counterpart"]) == (
        "test_cost", "calls_saved_per_solved", 3, "expensive_tests_A")
    assert (r["pass_ext"], r["pass_vs_A"], r["pass_vs_B"]) == (0.5, 0.6, 0.4)
    assert r["diff_vs_A"] == pytest.approx(-0.1) and r["diff_vs_B"] == pytest.approx(0.1)
    assert (r["n10_vs_B"], r["n01_vs_B"], r["n_vs_A"]) == (1, 0, 10) and 0 <= r["mcnemar_p_vs_A"] <= 1
    assert (r["calls_per_solved"], r["calls_per_solved_other"], r["calls_saved_per_solved"]) == (4.0, 7.0, 3.0)
    assert (r["revise_precision"], r["n_revised_patches"]) == (0.6, 5)  # 3 failing of 5 REVISEd patches
    assert (r["focus_ext"], r["focus_other"]) == (4.0, 7.0)


def test_edit_on_revise_mask_decision_and_rft_rows(tmp_path: Path, arms: list[str]) -> None:
    edit = _evals(tmp_path, "edit_on_revise", "B", [PASS_KEEP] * 4 + [FAIL_REVISE] * 4 + [PASS_REVISE] * 2,
                  ever_edited=lambda r: bool(r["ever_revised"]),
                  final_pass=lambda r: r["final_pass"] or (r["ever_revised"] and r["task_id"] % 2 == 0))
    mask = _evals(tmp_path, "mask_decision", "B", [PASS_KEEP] * 3 + [FAIL_KEEP] * 6 + [PASS_REVISE])
    rft = _evals(tmp_path, "rft_A", "A", [PASS_KEEP] * 7 + [FAIL_KEEP] * 3)
    paths = arms + edit + mask + rft
    sel = _selection(paths)
    edit_spec = extension_spec("edit_on_revise", "B", variant="edit_on_revise")
    (e, _) = extension_table("edit_on_revise", paths, sel, spec=edit_spec,
                             default_test_cost=1, resamples=200, seed=0, ci=0.95).to_pylist()
    assert (e["mechanism"], e["edited_revise_pass"], e["n_edited"]) == ("edit_on_revise", 0.5, 6)
    assert (e["never_revised_pass"], e["n_never_revised"]) == (1.0, 4)
    mask_spec = extension_spec("mask_decision", "B", mask_decision=True)
    (m, _) = extension_table("mask_decision", paths, sel, spec=mask_spec,
                             default_test_cost=1, resamples=200, seed=0, ci=0.95).to_pylist()
    assert (m["mechanism"], m["focus_metric"]) == ("mask_decision", "pred_freq_pass")
    assert (m["pred_freq_pass"], m["verified_freq_pass"]) == (0.9, 0.4)
    assert (m["pred_freq_pass_B"], m["verified_freq_pass_B"]) == (0.5, 0.5)
    (f, _) = extension_table("rft_A", paths, sel, spec=extension_spec("rft_A", "A", trainer="rft"),
                             default_test_cost=1, resamples=200, seed=0, ci=0.95).to_pylist()
    assert (f["mechanism"], f["pass_ext"], f["pass_rl"]) == ("rft", 0.7, 0.6)
    assert f["rft_minus_rl"] == pytest.approx(0.1) and math.isnan(f["revise_precision"])


def test_an_extension_spec_without_its_arm_is_refused_not_defaulted(tmp_path: Path, arms: list[str]) -> None:
    """The base arm's default lives on the config model (resolve_run applies it); a spec that names no arm is an
    error naming the extension, not a second default of "B"."""
    spec = extension_spec("edit_on_revise", "", variant="edit_on_revise")
    with pytest.raises(ValueError, match="edit_on_revise: its spec names no arm .the base_arm predict.runs.resolve_run"):
        extension_table("edit_on_revise", arms, _selection(arms), spec=spec, default_test_cost=1, resamples=200,
                        seed=0, ci=0.95)


def test_extensions_stage_writes_a_row_per_seed(tmp_path: Path, arms: list[str]) -> None:
    config = load_config(REPO / "config" / "local.yaml")
    ext_b = _evals(tmp_path, "expensive_tests_B", "B", [PASS_KEEP] * 5 + [FAIL_KEEP] * 5)
    ext_a = _evals(tmp_path, "expensive_tests_A", "A", [PASS_KEEP] * 5 + [FAIL_KEEP] * 5)
    out = tmp_path / "extensions" / "expensive_tests_B.parquet"
    assert main(["extensions", "--config-json", json.dumps(config), "--extension", "expensive_tests_B",
                 "--eval", *arms, *ext_a, *ext_b, "--out", str(out)]) == 0
    rows = pq.read_table(out).to_pylist()
    assert [(r["seed"], r["counterpart"], r["mechanism"]) for r in rows] == [
        (42, "expensive_tests_A", "test_cost"), (43, "expensive_tests_A", "test_cost")]
    assert main(["extensions", "--config-json", json.dumps(config), "--extension", "nope", "--eval", *arms,
                 "--out", str(out)]) != 0  # the CLI prints the ConfigError as one line


def test_the_test_campaign_takes_the_open_question_runs_like_the_other_rl_extensions() -> None:
    """Issue 28: irreversible_A/B and blind_A/B are in the paper's test campaign at their selected step, each seed,
    exactly as expensive_tests_A is (and, like it, with no reference checkpoint of their own)."""
    from predict.campaign import campaign_plan, planned_selection

    config = load_config(REPO / "config" / "config.yaml")
    ev = config["evaluation"]
    val = {(run, seed): (ev["checkpoints"] if run in config["arms"] else ev["extension_checkpoints"]
                         if run in config["extensions"] else [c for c in ev["checkpoints"] if c != "sft"])
           for run in study_runs(config) for seed in config["seeds"]}
    plan = campaign_plan(config, val, planned_selection(config, val))
    of = {run: [(c, s) for r, c, s in plan if r == run] for run in study_runs(config)}
    for run in ("irreversible_A", "irreversible_B", "blind_A", "blind_B"):
        assert of[run] == of["expensive_tests_A"] == [("step100", 42), ("step100", 43)], run
    assert of["A"] == [("sft", 42), ("step100", 42), ("step100", 43)]
