"""The test campaign has no side door (issue 26, src/predict/campaign/): one ledger per checkout whatever the
results_dir or run_name, keyed on the test split and the base model; a second design on them only when declared;
a resume only with the weights it started; test statistics only from the campaign's own files under its selection
and statistics settings; test tasks guarded by id, not by file name; each arm's SFT evaluated on test once; the
power of the test that is run at its Holm level."""

from __future__ import annotations

import gc
import json
import re
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from predict.campaign import (
    SplitGuardError,
    TestLedger,
    campaign_plan,
    campaign_test_split,
    check_test_inputs,
    config_hash,
    registry_ledger,
    select,
    test_task_ids,
)
from predict.config import fill_section, load_config, with_defaults
from predict.config.models import EvaluationSettings, SelectionSettings, plain_data
from predict.data import MBPP_SCHEMA
from predict.evaluate import CheckpointEval, evaluate_checkpoints, evaluation_config
from predict.outputs import read_rows, write_rows
from predict.stages import STAGES
from predict.stats import SELECTION_SCHEMA, power_table, study_stats

from .conftest import REPO
from .scripted_endpoint import ScriptedEndpoint
from .synthetic import record_campaign, small_test_campaign, write_test_split

SOLVE = 'CALL apply_patch {"find": "# Write your function here.", "replace": "def multiply_int(x, y):\\n    return x * y"}'


@pytest.fixture
def study(tmp_path: Path) -> dict[str, Any]:
    config = load_config(REPO / "config" / "local.yaml")
    # a results folder of its own: the campaign looks for history in the study's results_dir, and the checkout's
    # results/ may hold a real campaign (CI runs `all` before the tests) that this test's ledger does not know
    config["results_dir"] = str(tmp_path / "results")
    config["evaluation"]["tasks"] = 2  # the test split's first two tasks: enough for the ledger's rules
    return config


@pytest.fixture
def endpoint(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Any:
    import verifiers.v1.runtimes.subprocess as vf_subprocess

    monkeypatch.setattr(vf_subprocess, "CACHE_DIR", tmp_path / "verifiers-cache")
    with ScriptedEndpoint({"multiply": [SOLVE, "FINAL: done"], "": ["FINAL: no patch"]}) as ep:
        yield ep


@pytest.fixture
def test_split(tmp_path: Path, study: dict[str, Any]) -> Path:
    return write_test_split(study, tmp_path / "test.parquet")


def _val_stats(folder: Path, runs: tuple[str, ...] = ("A",), seeds: tuple[int, ...] = (42,)) -> tuple[Path, Path]:
    """The val statistics a campaign reads: each run evaluated at sft and step2 on val, step2 selected."""
    folder.mkdir(parents=True, exist_ok=True)
    selection = write_rows([{"run": r, "seed": s, "mode": "fixed", "step": 2, "checkpoint": "step2",
                             "val_pass_at_1": 0.5, "fallback": False} for r in runs for s in seeds],
                           SELECTION_SCHEMA, folder / "selection.parquet")
    metrics = write_rows([{"run": r, "checkpoint": c, "split": "val", "seed": s}
                          for r in runs for s in seeds for c in ("sft", "step2")],
                         pa.schema([("run", pa.string()), ("checkpoint", pa.string()), ("split", pa.string()),
                                    ("seed", pa.int64())]), folder / "metrics.parquet")
    return selection, metrics


def _campaign(config: dict, tasks: Path, results: Path, *checkpoints: str, run: str = "A", seed: int = 42,
              model: str = "scripted", **kw: Any) -> list[dict]:
    """One run/seed's test evaluations as the workflow's job runs them, into `results` (its own results_dir)."""
    selection, metrics = _val_stats(results / "stats")
    evals = [CheckpointEval(c, model, results / "eval" / run / c / "test" / f"seed{seed}.parquet") for c in checkpoints]
    return evaluate_checkpoints(evaluation_config(config, "test"), run=run, split="test", seed=seed,
                                tasks_path=tasks, checkpoints=evals,
                                selection_path=selection, val_metrics=metrics, **kw)


def test_a_new_results_dir_or_run_name_is_no_new_campaign(study, test_split: Path, endpoint, tmp_path: Path) -> None:
    """Old code: each results_dir had its own results/test/ledger.jsonl, so the same campaign ran again elsewhere."""
    _campaign(study, test_split, tmp_path / "first", "sft", "step2", base_url=endpoint.base_url)
    ledger = registry_ledger()  # the checkout's one ledger (the test's own here), outside every results_dir
    assert not (tmp_path / "first" / "test").exists()
    (campaign,) = TestLedger(ledger).campaigns()
    assert campaign["results_dir"] == str((tmp_path / "first").resolve())
    elsewhere = {**study, "run_name": "renamed", "results_dir": str(tmp_path / "second")}
    with pytest.raises(SplitGuardError, match=rf"{re.escape(str(ledger))}:\d+: A step2 seed 42 was already evaluated"):
        _campaign(elsewhere, test_split, tmp_path / "second", "step2", base_url=endpoint.base_url)
    assert not (tmp_path / "second" / "eval").exists()


def test_a_second_design_on_the_same_split_and_base_model_must_be_declared_and_is_listed(
    study, test_split: Path, endpoint, tmp_path: Path
) -> None:
    _campaign(study, test_split, tmp_path / "first", "step2", base_url=endpoint.base_url)
    ledger = registry_ledger()
    changed = {**study, "evaluation": {**study["evaluation"], "max_tokens": 97}}
    with pytest.raises(SplitGuardError, match=r"differs in evaluation\.max_tokens: .* must be declared: --new-campaign"):
        _campaign(changed, test_split, tmp_path / "second", "step2", base_url=endpoint.base_url)
    _campaign(changed, test_split, tmp_path / "second", "sft", "step2", base_url=endpoint.base_url,
              new_campaign="longer answers")
    first, second = TestLedger(ledger).campaigns()
    assert (first["reason"], second["reason"]) == (None, "longer answers")
    assert first["split_sha256"] == second["split_sha256"] and first["campaign"] != second["campaign"]
    # the paper's base model on the same split is another key: no collision with the embedded default's tiny model
    paper = {**study, "model": {**study["model"], "base": "Qwen/Qwen3-4B-Base"}}
    _campaign(paper, test_split, tmp_path / "paper", "step2", base_url=endpoint.base_url)
    assert [c["base_model"].split(":")[0] for c in TestLedger(ledger).campaigns()] == ["tiny", "tiny", "Qwen/Qwen3-4B-Base"]
    # the second campaign's statistics list both campaigns on the split, each with why
    files = sorted((tmp_path / "second" / "eval").glob("A/*/test/seed42.parquet"))
    listed = check_test_inputs(ledger, files, read_rows(tmp_path / "second" / "stats" / "selection.parquet"),
                               changed, STAGES["stats"].reads)
    assert [(c["reason"], c["this"], c["base_model"].split(":")[0]) for c in listed] == [
        ("", False, "tiny"), ("longer answers", True, "tiny"), ("", False, "Qwen/Qwen3-4B-Base")]


def test_a_resume_with_other_weights_is_refused(study, test_split: Path, endpoint, tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """Old code: the started line recorded the model's path, so other weights under the same name resumed."""
    import predict.env.runner as rollout_engine

    weights = tmp_path / "checkpoints" / "A" / "sft"
    weights.mkdir(parents=True)
    (weights / "model.safetensors").write_bytes(b"the weights that were tested")

    def killed(*args: Any, **kwargs: Any) -> None:
        raise KeyboardInterrupt("killed mid-campaign")

    with monkeypatch.context() as m:
        m.setattr(rollout_engine, "run_rollouts_sync", killed)
        with pytest.raises(KeyboardInterrupt):
            _campaign(study, test_split, tmp_path / "r", "sft", model=str(weights), base_url=endpoint.base_url)
    (weights / "model.safetensors").write_bytes(b"other weights, same folder")
    with pytest.raises(SplitGuardError, match=r"A sft seed 42 was started on test .* with other weights"):
        _campaign(study, test_split, tmp_path / "r", "sft", model=str(weights), base_url=endpoint.base_url)
    (weights / "model.safetensors").write_bytes(b"the weights that were tested")
    (summary,) = _campaign(study, test_split, tmp_path / "r", "sft", model=str(weights), base_url=endpoint.base_url)
    assert summary["rollouts"] == 2


def test_the_campaign_line_records_what_its_rows_depend_on(study, test_split: Path, endpoint, tmp_path: Path) -> None:
    from predict.serving.identity import serving_identity

    _campaign(study, test_split, tmp_path / "r", "step2", base_url=endpoint.base_url)
    (campaign,) = TestLedger(registry_ledger()).campaigns()
    depends = campaign["depends_on"]
    assert {k: depends[k] for k in ("vllm_version", "device", "batch_invariant", "concurrency")} == {
        "vllm_version": serving_identity(study["serving"], concurrency=4)["vllm_version"], "device": "cpu",
        "batch_invariant": False, "concurrency": 1}  # the CPU has no batch invariance: one request at a time
    assert depends["device_name"] and depends["serving"]["device"] == "cpu" and "python" not in depends["serving"]
    assert campaign["task_ids"] == sorted(campaign_test_split(study).task_ids) and campaign["selection"] == [{"run": "A", "seed": 42,
                                                                           "checkpoint": "step2"}]


@pytest.fixture
def frozen(tmp_path: Path, study: dict) -> dict[str, Any]:
    """A synthetic test campaign (tests/synthetic.py) recorded in a ledger as the campaign records one."""
    paths, selection, ablations, _ = small_test_campaign(tmp_path / "eval")
    # as the stages load it: the config's ablations section as plain data (predict.config.models.plain_data)
    config = with_defaults({**study, "ablations": plain_data(ablations), "extensions": {}})
    ledger = tmp_path / "campaign" / "ledger.jsonl"
    ledger.parent.mkdir()
    record_campaign(ledger, config, paths, selection)
    return {"paths": paths, "selection": selection, "config": config, "ledger": ledger}


def test_test_statistics_read_only_the_frozen_campaign(frozen: dict[str, Any], tmp_path: Path) -> None:
    """Old code: `predict stats` on test never read the ledger, so a changed selection, other bootstrap settings or
    a file the campaign never wrote were all accepted."""
    ledger, paths, selection, config = frozen["ledger"], frozen["paths"], frozen["selection"], frozen["config"]
    reads = STAGES["stats"].reads
    (this,) = check_test_inputs(ledger, paths, selection, config, reads)
    assert this["this"] and this["n_done"] == this["n_planned"] == len(paths)
    moved = [{**s, "checkpoint": "step50"} if s["run"] == "forced_keep" else s for s in selection]
    with pytest.raises(SplitGuardError, match=r"selection differs from the frozen one for forced_keep seed 42 "
                                              r"\(step100 -> step50\)"):
        check_test_inputs(ledger, paths, moved, config, reads)
    other = {**config, "evaluation": {**config["evaluation"], "bootstrap": {"resamples": 500, "seed": 0, "ci": 0.95}}}
    with pytest.raises(SplitGuardError, match=r"statistics settings differ from the frozen design in "
                                              r"evaluation\.bootstrap\.resamples"):
        check_test_inputs(ledger, paths, selection, other, reads)
    with pytest.raises(SplitGuardError, match=r"A step100 seed 42 are not among the inputs"):
        check_test_inputs(ledger, [p for p in paths if "/A/step100/" not in str(p)], selection, config, reads)
    table = pq.read_table(paths[0])
    pq.write_table(table.slice(0, table.num_rows - 1), paths[0])  # a task dropped after the campaign
    with pytest.raises(SplitGuardError, match=rf"{re.escape(str(paths[0]))}: not a test evaluation that .* records "
                                              "as done"):
        check_test_inputs(ledger, paths, selection, config, reads)


def test_the_stats_stage_on_test_refuses_without_the_campaigns_ledger(frozen: dict[str, Any], tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture) -> None:
    from predict.cli import main

    selection = write_rows(frozen["selection"], SELECTION_SCHEMA, tmp_path / "selection.parquet")
    args = ["stats", "--config-json", json.dumps(frozen["config"]), "--eval", *map(str, frozen["paths"]),
            "--selection", str(selection), "--out-dir", str(tmp_path / "test-stats")]
    assert main(args) == 2  # the checkout's ledger (this test's own) holds no campaign: one line, no traceback
    assert "the test statistics read the campaign's ledger" in capsys.readouterr().err
    assert main([*args, "--test-ledger", str(frozen["ledger"])]) == 0
    (row,) = read_rows(tmp_path / "test-stats" / "campaigns.parquet")
    assert row["this"] and row["n_done"] == len(frozen["paths"])


def test_test_tasks_are_guarded_by_id_not_by_file_name(study, test_split: Path, endpoint, mbpp_rows: list[dict],
                                                       tmp_path: Path) -> None:
    """Old code: a renamed copy of the test split rolled out with --split val passed the name-based guard."""
    from predict.cli import main
    from predict.rollouts import RolloutJob, run_job

    data = {"mbpp_path": str(REPO / "resources" / "mbpp" / "mbpp.jsonl"), "split_seed": 42,
            "sizes": {"sft": 212, "rl": 212, "test": 500}}
    (tmp_path / "split-slice.json").write_text(json.dumps({"data": data}))
    assert main(["split", "--config-slice", str(tmp_path / "split-slice.json"), "--out-dir", str(tmp_path / "data")]) == 0
    test_ids = {r["task_id"] for r in read_rows(tmp_path / "data" / "test.parquet")}
    assert test_task_ids(registry_ledger()) == test_ids and len(test_ids) == 500
    disguised = write_rows(read_rows(tmp_path / "data" / "test.parquet")[:3], MBPP_SCHEMA, tmp_path / "val-copy.parquet")
    job = RolloutJob(tasks_path=disguised, split="val", out=tmp_path / "o.parquet", model="scripted", checkpoint="base",
                     arm="A", seed=42, base_url=endpoint.base_url)
    with pytest.raises(SplitGuardError, match=r"val-copy\.parquet: 3 of its tasks are test tasks \(\d+, \d+, \d+;"):
        run_job(job, study)
    assert not endpoint.requests
    val = tmp_path / "data" / "val.parquet"
    assert run_job(RolloutJob(**{**job.__dict__, "tasks_path": val, "n_tasks": 1}), study)["rollouts"] == 1


def test_each_arms_sft_is_evaluated_on_test_once_and_serves_every_seed(tmp_path: Path) -> None:
    """Old code: the plan evaluated A's one SFT checkpoint on test once per RL seed."""
    from .synthetic import PASS_KEEP, rollout, write_eval

    # the evaluation section as a loaded config holds it (its defaults filled in: the campaign reads it typed)
    config = {"arms": {"A": {"protocol": "reactive"}}, "ablations": {}, "extensions": {}, "seeds": [42, 43],
              "evaluation": fill_section(EvaluationSettings, {"reference": "sft"})}
    val = {("A", s): ["sft", "step2"] for s in (42, 43)}
    assert campaign_plan(config, val, {("A", 42): "step2", ("A", 43): "step2"}) == [
        ("A", "sft", 42), ("A", "step2", 42), ("A", "step2", 43)]
    # and the test statistics pair seed 43's RL with the one SFT evaluation
    paths = [write_eval(tmp_path, "A", c, s, [rollout(t, [PASS_KEEP], arm="A", seed=s, checkpoint=c, split="test")
                                              for t in range(4)], split="test")
             for c, s in (("sft", 42), ("step2", 42), ("step2", 43))]
    selection = [{"run": "A", "seed": s, "mode": "fixed", "step": 2, "checkpoint": "step2", "val_pass_at_1": 0.5,
                  "fallback": False} for s in (42, 43)]
    tables = study_stats(paths, arms=["A"], selection=selection, resamples=100, reference="sft",
                         default_test_cost=1, seed=0, ci=0.95)
    pairs = [p for p in tables["pairs"].to_pylist() if p["kind"] == "vs_reference" and p["metric"] == "final_pass"]
    assert [(p["seed_a"], p["checkpoint_b"], p["seed_b"]) for p in pairs] == [(42, "sft", 42), (43, "sft", 42)]
    assert [(m["checkpoint"], m["seed"]) for m in tables["metrics"].to_pylist()] == [("sft", 42), ("step2", 42),
                                                                                      ("step2", 43)]


def test_power_is_given_at_the_holm_level_of_the_family_the_report_adjusts() -> None:
    """The issue's numbers: 5 points at discordance 0.2 on 500 tasks, 0.68 for one test, 0.47 at the first Holm level
    of the 4 A-vs-B seed pairings (old code: one unadjusted power only)."""
    (row,) = power_table(deltas=[0.05], discordances={"config": [0.2]}, tasks=[500], significance=0.05,
                         target=0.8, family_size=4).to_pylist()
    assert round(row["power"], 2) == 0.68 and round(row["power_holm"], 2) == 0.47
    assert row["holm_significance"] == 0.0125 and row["family_size"] == 4 and not row["powered_holm"]


def test_the_holm_column_is_a_lower_bound_of_the_power_and_the_report_says_at_least(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Issue 38: alpha/m is the strictest level of a Holm family, not the most lenient, so ``power_holm`` is a lower
    bound of a test's power under Holm. Simulated (4 independent pairings, n 500, discordance 0.2, 5 points), Holm's
    power lies between the column and the unadjusted power; the report says "at least", never "the power as the
    report runs it" (old code)."""
    import numpy as np

    from predict.report.power import power_section
    from predict.stats.exact import holm
    from predict.stats.power import mcnemar_exact_p

    (row,) = power_table(deltas=[0.05], discordances={"config": [0.2]}, tasks=[500], family_size=4,
                         significance=0.05, target=0.8).to_pylist()
    rng = np.random.default_rng(0)
    discordant = rng.binomial(500, 0.2, size=(2000, 4))
    wins = rng.binomial(discordant, (1 + 0.05 / 0.2) / 2)
    p = mcnemar_exact_p(wins, discordant)
    # Holm row by row, vectorised: statsmodels' multipletests runs gc.collect() on every call, and 2000 calls in a
    # long pytest process (a large heap) took over 900 s in CI. The report's own holm() checks it on 50 rows.
    order = np.argsort(p, axis=1)
    stepped = np.take_along_axis(p, order, axis=1) * np.arange(4, 0, -1)
    adjusted = np.empty_like(p)
    np.put_along_axis(adjusted, order, np.minimum(np.maximum.accumulate(stepped, axis=1), 1.0), axis=1)
    # That gc.collect() is most of these 50 calls too (0.1 s a call in a fresh process, ~0.45 s in CI's late, large
    # one: the 900 s above): a no-op while they run; it changes no number.
    monkeypatch.setattr(gc, "collect", lambda *args: 0)
    assert np.allclose(adjusted[:50], [holm(list(ps)) for ps in p[:50]])
    monkeypatch.undo()
    rejected = adjusted[:, 0] < 0.05
    assert row["power_holm"] + 0.03 < rejected.mean() < row["power"] - 0.03
    from predict.stages import stage_settings

    study = load_config(REPO / "config" / "local.yaml")
    study["power"] |= {"significance": 0.05, "target": 0.8}
    study["data"]["sizes"]["test"] = 500
    section = power_section([{**row, "design": "test"}], stage_settings("report", study))  # the report's typed object
    assert "power, Holm-adjusted (at least; A vs B, family of 4)" in section and "strictest level" in section
    assert "as the report runs it:" not in section and "at most significance" not in section


def test_selection_has_one_default_and_one_owner() -> None:
    """The selection settings' default lives in predict.config.models only (it was written in cli.py twice,
    evaluate.py and stats.py, then as predict.campaign.DEFAULT_SELECTION); no module spells it as a dict."""
    assert select({}, [{"run": "A", "seed": 1, "split": "val", "checkpoint": f"step{s}", "pass_at_1": 0.1}
                       for s in (50, 100)])[0]["checkpoint"] == f"step{SelectionSettings().step}"
    literal = re.compile(r"""["']mode["']\s*:\s*["']fixed["']\s*,\s*["']step["']\s*:\s*\d""")
    holders = [p.relative_to(REPO).as_posix() for p in (REPO / "src" / "predict").rglob("*.py")
               if literal.search(p.read_text())]
    assert holders == [], holders


# -- existing ledgers stay valid -------------------------------------------------------------------------------------

PINNED = Path(__file__).parent / "data" / "campaign_pin"
"""The evaluate-test slices of config/config.yaml and config/local.yaml as the workflow wrote them at d7db7ef (the
last commit with src/predict/campaign.py one module), the ledger lines that code wrote for them (ledger.jsonl), and
config/config.yaml whole as it loaded then (config-whole.json: names, paths, power, cluster, bundle, tracking)."""
PINNED_DESIGNS = {  # slice -> (design hash, campaign id), as the code at d7db7ef computed them
    "config": ("13ee664b149d4cbf922c84ed2c029cff0d24d95e9ce85969b7a24efadf72a15c", "374c7972068b107e"),
    "local": ("c57b02d5cfbe212819a7e928bcf8a5cda86a56a2600116bcd097de3b58daac71", "1c247cb919647e83"),
}


def _admit_pinned(ledger: Path, name: str, tmp_path: Path) -> tuple[dict[str, Any], Any]:
    """The admission the pinned ledger's line of `name` recorded, made again by today's code."""
    fixed = json.loads((PINNED / f"{name}-evaluate-test.json").read_text())
    tasks = write_test_split(fixed, tmp_path / f"test-{name}.parquet")
    (admission,) = TestLedger(ledger).admit(
        fixed, [("A", "sft", 42), ("A", "step100", 42), ("B", "sft", 42), ("B", "step100", 42)],
        [("A", "step100", 42, "the-weights")], tasks_path=tasks,
        selection=[{"run": r, "seed": 42, "checkpoint": "step100", "mode": "fixed"} for r in ("A", "B")],
        depends_on={"vllm_version": "0.0.0", "device_name": "cpu", "serving": {"device": "cpu"}},
        origin={"results_dir": "/nowhere/results", "run_name": name})
    return fixed, admission


def _timeless(ledger_text: str) -> str:
    return re.sub(r'"time": "[^"]*"', '"time": "(when)"', ledger_text)


def test_the_design_hash_and_the_campaign_line_are_the_bytes_the_old_code_wrote(tmp_path: Path) -> None:
    """A frozen campaign stays frozen across refactors: the design hash the code before the campaign package wrote
    for a fixed slice is still one of its design hashes (`design_hashes`: the scheduling keys left the design in
    issue 60, so today's hash is new), the campaign line a fresh ledger gets is that code's line but for the hash, the
    id and the keys that left, and a ledger that code wrote admits the same evaluation into its own campaign,
    appending nothing."""
    from predict.campaign import base_model_identity, campaign_id, campaign_test_split, design_hashes

    old = (PINNED / "ledger.jsonl").read_text()
    ledger = tmp_path / "new" / "ledger.jsonl"
    for name, (digest, ident) in PINNED_DESIGNS.items():
        fixed, admission = _admit_pinned(ledger, name, tmp_path)
        assert design_hashes(fixed) == [config_hash(fixed), digest], name
        today = campaign_id(campaign_test_split(fixed).sha256, base_model_identity(fixed), config_hash(fixed))
        assert admission.campaign == today != ident, name
    # the whole config hashes to its slice's design: every key the design leaves out is still left out
    whole = json.loads((PINNED / "config-whole.json").read_text())
    assert design_hashes(whole) == design_hashes(json.loads((PINNED / "config-evaluate-test.json").read_text()))
    assert design_hashes(whole)[1] == PINNED_DESIGNS["config"][0]
    new_lines = [json.loads(line) for line in ledger.read_text().splitlines()]
    old_lines = [json.loads(line) for line in old.splitlines()]
    assert len(new_lines) == len(old_lines) == 2
    for new, was in zip(new_lines, old_lines, strict=True):
        for runtime in ("rl", "sft"):
            del was["design"]["prime_rl"][runtime]["runtime"]
        changed = {k for k in new.keys() | was.keys() if new.get(k) != was.get(k)}
        assert changed == {"config_hash", "campaign", "time"}, changed
    kept = tmp_path / "old" / "ledger.jsonl"
    kept.parent.mkdir()
    kept.write_text(old)
    for name, (_, ident) in PINNED_DESIGNS.items():
        assert _admit_pinned(kept, name, tmp_path)[1].campaign == ident
    assert kept.read_text() == old


def test_a_time_limit_is_scheduling_not_design_and_an_old_ledger_still_holds(tmp_path: Path) -> None:
    """prime-rl's time limits (prime_rl.rl.runtime, prime_rl.sft.runtime) say how long SLURM lets a job run, not what
    it computes (issue 60): editing one keeps the design hash, reruns no job of the test campaign, and a ledger the
    earlier code froze with the old limit admits the evaluation into that campaign, appending nothing."""
    from predict.stages import slice_params

    fixed = json.loads((PINNED / "config-evaluate-test.json").read_text())
    longer = json.loads(json.dumps(fixed))
    longer["prime_rl"]["rl"]["runtime"], longer["prime_rl"]["sft"]["runtime"] = 2880, 480
    assert config_hash(longer) == config_hash(fixed)
    assert slice_params(longer, "evaluate-test") == slice_params(fixed, "evaluate-test")
    kept = tmp_path / "ledger.jsonl"
    kept.write_text((PINNED / "ledger.jsonl").read_text())
    tasks = write_test_split(longer, tmp_path / "test.parquet")
    (admission,) = TestLedger(kept).admit(
        longer, [("A", "sft", 42), ("A", "step100", 42), ("B", "sft", 42), ("B", "step100", 42)],
        [("A", "step100", 42, "the-weights")], tasks_path=tasks,
        selection=[{"run": r, "seed": 42, "checkpoint": "step100", "mode": "fixed"} for r in ("A", "B")],
        depends_on={"vllm_version": "0.0.0", "device_name": "cpu", "serving": {"device": "cpu"}},
        origin={"results_dir": "/nowhere/results", "run_name": "config"})
    assert admission.campaign == PINNED_DESIGNS["config"][1]
    assert kept.read_text() == (PINNED / "ledger.jsonl").read_text()


def test_a_campaign_is_evaluated_on_a_server_like_the_one_it_started_on(tmp_path: Path) -> None:
    """Issue 59: on a GPU a server with another vLLM, card, attention kernels, environment or flags (a compile that
    chooses kernels by timing) can give the same weights other rows, so a campaign's later evaluations are refused
    there, naming what differs; the driver and the requests in flight are not compared, nor a key the campaign line
    lacks (a ledger written before it was recorded still admits)."""
    fixed = json.loads((PINNED / "config-evaluate-test.json").read_text())
    tasks = write_test_split(fixed, tmp_path / "test.parquet")
    plan = [("A", "sft", 42), ("A", "step100", 42), ("B", "sft", 42), ("B", "step100", 42)]
    selection = [{"run": r, "seed": 42, "checkpoint": "step100", "mode": "fixed"} for r in ("A", "B")]
    gpu = {"vllm_version": "0.26.0", "device": "gpu", "device_name": "NVIDIA H100 80GB HBM3", "batch_invariant": True,
           "attention_backend": "TRITON_ATTN", "concurrency": 64, "driver": "580.1",
           "environment": {"VLLM_BATCH_INVARIANT": "1", "TORCHINDUCTOR_DETERMINISTIC": "1"},
           "server_args": ["--compilation-config", "{}", "--attention-backend", "TRITON_ATTN"]}
    ledger = tmp_path / "ledger.jsonl"

    def admit(depends_on: dict[str, Any], ledger: Path = ledger, entry: str = "sft") -> Any:
        return TestLedger(ledger).admit(fixed, plan, [("A", entry, 42, "the-weights")], tasks_path=tasks,
                                        selection=selection, depends_on=depends_on,
                                        origin={"results_dir": "/nowhere/results", "run_name": "config"})

    admit(gpu)
    admit({**gpu, "driver": "590.2", "concurrency": 32}, entry="step100")  # neither decides greedy rows
    for key, other in (("environment", {"VLLM_BATCH_INVARIANT": "1"}), ("device_name", "NVIDIA H200"),
                       ("vllm_version", "0.27.0"), ("server_args", ["--attention-backend", "TRITON_ATTN"])):
        with pytest.raises(SplitGuardError, match=rf"frozen at .* on another server: {key} .* then, .* now"):
            admit({**gpu, key: other}, entry="step100")
    # the pinned ledger's campaign recorded vllm_version, device_name and serving only: the rest is not compared
    kept = tmp_path / "old" / "ledger.jsonl"
    kept.parent.mkdir()
    kept.write_text((PINNED / "ledger.jsonl").read_text())
    admit({"vllm_version": "0.0.0", "device_name": "cpu", "serving": {"device": "cpu"}, "environment": {"X": "1"}},
          ledger=kept, entry="step100")
    with pytest.raises(SplitGuardError, match="device_name 'cpu' then, 'NVIDIA H100 80GB HBM3' now"):
        admit({**gpu, "vllm_version": "0.0.0"}, ledger=kept, entry="step100")
