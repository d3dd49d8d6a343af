"""The study bundle (`predict bundle`) and `predict verify-bundle` on a small synthetic study (tests/bundle_study.py):
the bundle holds what the report rests on and checks out, and every edit a careless or dishonest hand would make is
caught, naming what changed. A dishonest edit also rewrites the manifest's hashes (`rehash`), so that only
re-deriving the numbers can catch it. (CI builds the embedded default's real bundle and re-executes test rollouts
from it: .ci/run.)"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.bundle_study import EXAMPLE, bundle_study


@pytest.fixture(scope="module")
def study(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], Path, Path]:
    """(config, bundle folder, campaign ledger) of one synthetic study, built once for the module."""
    root = tmp_path_factory.mktemp("bundle-study")
    ledger = root / "ledger.jsonl"
    config, bundle = bundle_study(root, ledger)
    return config, bundle, ledger


@pytest.fixture
def bundle(study: tuple[dict[str, Any], Path, Path], tmp_path: Path) -> Path:
    """A copy of the study's bundle to tamper with."""
    return Path(shutil.copytree(study[1], tmp_path / "bundle"))


def manifest(bundle: Path) -> dict[str, Any]:
    return json.loads((bundle / "manifest.json").read_text())


def write_manifest(bundle: Path, data: dict[str, Any]) -> None:
    (bundle / "manifest.json").write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")


def rehash(bundle: Path) -> None:
    """What a dishonest editor does after an edit: the manifest's sha256 and size of every file, recomputed."""
    from predict.bundle import bundle_files, sha256_file

    data = manifest(bundle)
    data["files"] = {rel: {"sha256": sha256_file(bundle / rel), "bytes": (bundle / rel).stat().st_size}
                     for rel in bundle_files(bundle)}
    write_manifest(bundle, data)


def edit_table(path: Path, row: int, column: str, value: Any) -> Any:
    """Set one cell of a parquet table (its schema kept); returns the old value."""
    table = pq.read_table(path)
    rows = table.to_pylist()
    old, rows[row][column] = rows[row][column], value
    pq.write_table(pa.Table.from_pylist(rows, schema=table.schema), path)
    return old


def flip(path: Path, row: int) -> None:
    """One row's outcome flipped: final_pass and what goes with it (final_outcome, reward)."""
    passed = not pq.read_table(path).to_pylist()[row]["final_pass"]
    edit_table(path, row, "final_pass", passed)
    edit_table(path, row, "final_outcome", "PASS" if passed else "ASSERTION_FAILURE")
    edit_table(path, row, "reward", float(passed))


def verdicts(bundle: Path, **kw: Any) -> dict[str, Any]:
    from predict.bundle.verify import verify

    return {level.name: level for level in verify(bundle, **kw)}


def assert_fails(levels: dict[str, Any], level: str, *named: str) -> str:
    assert levels[level].status == "fails", {n: (v.status, v.why) for n, v in levels.items()}
    for text in named:
        assert text in levels[level].why, levels[level].why
    return levels[level].why


# -- what the bundle holds, and that it checks out ----------------------------------------------------------------


def test_the_bundle_holds_what_the_report_rests_on(study: tuple[dict[str, Any], Path, Path]) -> None:
    from predict.bundle import MANIFEST_KEYS, bundle_files, sha256_file
    from predict.campaign import config_hash, read_ledger
    from predict.stats import STATS_TABLES, TEST_STATS_TABLES

    config, bundle, ledger = study
    results = Path(config["results_dir"])
    data = manifest(bundle)
    assert set(MANIFEST_KEYS) <= set(data) and data["config"] == config
    assert data["design_hash"] == config_hash(config)
    files = set(bundle_files(bundle))
    assert set(data["files"]) == files
    # every evaluation (val and test), every statistics table, the selection, the report, the ledger lines
    evals = {p.relative_to(results).as_posix() for p in results.glob("eval/*/*/*/seed*.parquet")}
    assert evals <= files and any("/val/" in e for e in evals) and any("/test/" in e for e in evals)
    assert {f"stats/{t}.parquet" for t in (*STATS_TABLES, "power", "training_outcomes")} <= files
    assert {f"test/stats/{t}.parquet" for t in (*TEST_STATS_TABLES, "open_question")} <= files
    assert {"report/index.html", "ablations/forced_keep.parquet", "extensions/edit_on_revise.parquet",
            "extensions/open_question.parquet", "ledger.jsonl"} <= files
    assert all(sha256_file(bundle / rel) == sha256_file(results / rel) for rel in evals)
    lines = [e for _, e in read_ledger(bundle / "ledger.jsonl")]
    assert [e for _, e in read_ledger(ledger)] == lines  # this study's registry holds this split only
    assert {e.get("event") or e.get("status") for e in lines} == {"split", "campaign", "done"}
    # the manifest: code, data, both environments, serving, devices, checkpoints
    assert len(data["code"]["commit"] or "") == 40 and isinstance(data["code"]["dirty"], bool)
    assert data["data"]["mbpp_sha256"] == config["data"]["mbpp_sha256"]
    assert len(data["data"]["splits"]["test"]["task_ids"]) == 500
    assert "pyarrow" in data["environments"]["pipeline"]["packages"]
    assert data["environments"]["serving"].get("packages") or data["environments"]["serving"].get("error")
    assert "--max-model-len" in data["serving"]["command"] and data["devices"]["evaluation"]["device"] == "cpu"
    weights = {(e["run"], e["checkpoint"], e["seed"]): e["weights"] for e in lines if e.get("status") == "done"}
    ckpts = {(c["run"], c["checkpoint"], c["seed"]): c for c in data["checkpoints"]}
    assert weights and all(ckpts[k]["identity"] == w for k, w in weights.items())
    assert ckpts[("forced_keep", "step2", 42)]["path"] == "rl/forced_keep/seed42/step2"
    assert all(c["weights"] is None and c["model"] is None for c in ckpts.values())
    assert not (bundle / "weights").exists()
    assert data["report"]["example"] == EXAMPLE
    # the order the workflow hands the report its tables (config order), which the stages' sorted slices lose
    assert data["inputs"]["ablations"] == ["ablations/forced_keep.parquet", "ablations/alpha0.parquet"]
    assert data["inputs"]["extensions"] == ["extensions/mask_decision.parquet", "extensions/edit_on_revise.parquet"]


def bundled_rows(bundle: Path, picks: Any) -> list[dict[str, Any]]:
    """What a faithful replay gives back: the bundled rows, their times changed (those are not compared)."""
    rows = [pq.read_table(bundle / p.evaluation).slice(p.row, 1).to_pylist()[0] for p in picks]
    return [{**r, "wall_s": r["wall_s"] + 1.0, "created_at": r["created_at"] + 60} for r in rows]


def test_the_bundle_checks_out_at_every_level(study: tuple[dict[str, Any], Path, Path],
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    config, bundle, _ = study
    replayed: list[Any] = []

    def replay(config: Any, picks: Any, models: Any, **kw: Any) -> list[dict[str, Any]]:
        assert all(Path(m).is_dir() for m in models.values()) and not kw["scratch"].is_relative_to(bundle)
        replayed.extend(picks)
        return bundled_rows(bundle, picks)

    # the replay itself needs a vLLM server: CI runs it on the embedded default (.ci/run)
    monkeypatch.setattr("predict.bundle.rerun.replay_test_rollouts", replay)
    levels = verdicts(bundle, rerun=4, checkpoints=Path(config["results_dir"]))
    assert [v.status for v in levels.values()] == ["checks out"] * 3, {n: v.why for n, v in levels.items()}
    assert len(replayed) == 4 and len({(p.run, p.checkpoint) for p in replayed}) == 4  # spread over evaluations


def test_the_archive_unpacks_to_the_bundle_and_is_byte_stable(study: tuple[dict[str, Any], Path, Path],
                                                              tmp_path: Path) -> None:
    from predict.bundle import bundle_files, sha256_file
    from predict.bundle.build import write_archive
    from predict.bundle.verify import Verifier, opened

    _, bundle, _ = study
    archive = bundle.with_name("bundle.tar.gz")
    with opened(archive) as unpacked:
        assert bundle_files(unpacked) == bundle_files(bundle)
        assert sha256_file(unpacked / "manifest.json") == sha256_file(bundle / "manifest.json")
        v = Verifier(unpacked, tmp_path)
        v.check_manifest()
        assert v.check_files().startswith(f"files: {len(bundle_files(bundle))} files")
    again = write_archive(bundle, tmp_path / "again.tar.gz")
    assert again.read_bytes() == archive.read_bytes()  # byte-stable: no times or owners in it


# -- every edit is caught, naming what changed ----------------------------------------------------------------------


def test_a_flipped_outcome_in_a_val_row_is_named(bundle: Path) -> None:
    flip(bundle / "eval/A/step2/val/seed42.parquet", 0)
    rehash(bundle)
    levels = verdicts(bundle)
    assert levels["available"].status == "checks out"
    assert_fails(levels, "functional", "stats/metrics.parquet row", "run=A", "checkpoint=step2", "split=val",
                 "re-derived from the evaluation rows")


def test_a_flipped_outcome_in_a_test_row_is_named(bundle: Path) -> None:
    flip(bundle / "eval/B/step2/test/seed42.parquet", 3)
    rehash(bundle)
    assert_fails(verdicts(bundle), "functional", "eval/B/step2/test/seed42.parquet",
                 "not the file the campaign recorded done")


def test_an_edited_p_value_is_named(bundle: Path) -> None:
    table = pq.read_table(bundle / "test/stats/pairs.parquet").to_pylist()
    row = next(i for i, r in enumerate(table) if r["kind"] == "A_vs_B")
    edit_table(bundle / "test/stats/pairs.parquet", row, "mcnemar_p", 0.0312)
    rehash(bundle)
    assert_fails(verdicts(bundle), "functional", f"test/stats/pairs.parquet row {row}", "mcnemar_p",
                 "0.0312 in the bundle")


def test_an_edited_number_the_report_prints_is_named(study: tuple[dict[str, Any], Path, Path]) -> None:
    # the whole check (the page re-rendered from the re-derived tables equals the bundled one) runs in
    # test_the_bundle_checks_out_at_every_level; here, what it says of a page with one number edited
    from predict.bundle.rederive import report_difference, report_numbers

    page = (study[1] / "report/index.html").read_text()
    section = page.index('<section id="test-headline">')
    cut = page.index("% (", section)  # the first rate the test headline prints
    start = page.rindex(">", 0, cut) + 1
    edited = page[:start] + "99.9" + page[cut:]
    assert report_numbers(page) > 100 and report_difference(page, page, compare_figures=True) is None
    difference = report_difference(edited, page, compare_figures=True)
    assert difference.startswith("report/index.html: section test-headline") and "'99.9% (" in difference
    redrawn = page.replace("base64,iVBOR", "base64,iVBOx", 1)
    assert "figure 1 differs" in report_difference(page, redrawn, compare_figures=True)
    assert report_difference(page, redrawn, compare_figures=False) is None


def test_a_replaced_file_is_named(bundle: Path) -> None:
    shutil.copyfile(bundle / "stats/metrics.parquet", bundle / "stats/selection.parquet")
    levels = verdicts(bundle)
    assert_fails(levels, "available", "stats/selection.parquet", "changed or replaced")
    assert levels["functional"].status == "not checked"


def test_a_file_added_or_left_out_is_named(bundle: Path) -> None:
    (bundle / "stats" / "notes.txt").write_text("an extra file")
    assert_fails(verdicts(bundle), "available", "stats/notes.txt: in the bundle but not in its manifest")
    (bundle / "stats" / "notes.txt").unlink()
    (bundle / "ablations/forced_keep.parquet").unlink()
    assert_fails(verdicts(bundle), "available", "ablations/forced_keep.parquet: listed in the manifest, missing")


def test_a_test_evaluation_outside_the_plan_is_named(bundle: Path) -> None:
    rows = pq.read_table(bundle / "eval/A/step2/test/seed42.parquet").to_pylist()
    extra = bundle / "eval/A/step1/test/seed42.parquet"
    extra.parent.mkdir(parents=True)
    pq.write_table(pa.Table.from_pylist([{**r, "checkpoint": "step1"} for r in rows],
                                        schema=pq.read_schema(bundle / "eval/A/step2/test/seed42.parquet")), extra)
    rehash(bundle)
    assert_fails(verdicts(bundle), "functional", "eval/A/step1/test/seed42.parquet", "A step1 42",
                 "not in the test campaign's plan")


def test_a_changed_design_key_is_named(bundle: Path) -> None:
    from predict.campaign import config_hash

    data = manifest(bundle)
    data["config"]["rl"]["lr"] *= 10
    write_manifest(bundle, data)
    assert_fails(verdicts(bundle), "functional", "design_hash", "is not its config's")  # a careless edit
    data["design_hash"] = config_hash(data["config"])  # a dishonest one
    write_manifest(bundle, data)
    assert_fails(verdicts(bundle), "functional", "froze design hash", "differs in rl.lr")


def test_a_task_moved_between_splits_is_named(bundle: Path) -> None:
    data = manifest(bundle)
    splits = data["data"]["splits"]
    moved = splits["test"]["task_ids"].pop()
    splits["val"]["task_ids"] = sorted([*splits["val"]["task_ids"], moved])
    write_manifest(bundle, data)
    assert_fails(verdicts(bundle), "functional", f"task {moved} is in the bundle's val split",
                 "with seed 42 puts it in test")


def test_a_row_of_another_split_is_named(bundle: Path) -> None:
    data = manifest(bundle)
    test_task = data["data"]["splits"]["test"]["task_ids"][-1]
    edit_table(bundle / "eval/B/sft/val/seed42.parquet", 2, "task_id", test_task)
    rehash(bundle)
    assert_fails(verdicts(bundle), "functional", "eval/B/sft/val/seed42.parquet row 2", f"task {test_task} is not a "
                 "val task", "puts it in test")


def test_verify_bundle_exits_non_zero_naming_the_first_failure(bundle: Path, capsys: pytest.CaptureFixture) -> None:
    from predict.cli import main

    shutil.copyfile(bundle / "stats/metrics.parquet", bundle / "stats/selection.parquet")
    assert main(["verify-bundle", str(bundle)]) == 1
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert "does not check out" in last and "stats/selection.parquet" in last


# -- reproduced: the test rollouts re-executed (the replay itself runs in CI, on the embedded default) --------------


@pytest.fixture
def verifier(study: tuple[dict[str, Any], Path, Path], tmp_path: Path) -> Any:
    """A verifier of the study's bundle past the checks --rerun builds on (the split, the ledger)."""
    from predict.bundle.verify import Verifier

    v = Verifier(study[1], tmp_path / "work")
    for check in (v.check_manifest, v.check_split, v.check_ledger):
        check()
    return v


def test_rerun_names_the_first_column_a_re_executed_row_differs_in(study: tuple[dict[str, Any], Path, Path],
                                                                   verifier: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from predict.bundle.verify import CheckFailed

    config, bundle, _ = study
    replayed: list[Any] = []

    def replay(config: Any, picks: Any, models: Any, **kw: Any) -> list[dict[str, Any]]:
        replayed.extend(picks)
        rows = bundled_rows(bundle, picks)
        return [{**rows[0], "final_outcome": "TIMEOUT"}, *rows[1:]]

    monkeypatch.setattr("predict.bundle.rerun.replay_test_rollouts", replay)
    with pytest.raises(CheckFailed) as failed:
        verifier.check_rerun(2, 7, Path(config["results_dir"]))
    first = replayed[0]
    assert f"{first.evaluation} row {first.row} (task {first.task_id}, sample 0) re-executed: final_outcome" \
        in str(failed.value) and "TIMEOUT' re-executed" in str(failed.value)
    with pytest.raises(CheckFailed, match="--rerun needs the checkpoints"):
        verifier.check_rerun(1, 0, None)


def test_rerun_refuses_weights_other_than_the_evaluated(study: tuple[dict[str, Any], Path, Path], verifier: Any,
                                                       tmp_path: Path) -> None:
    from predict.bundle.verify import CheckFailed

    results = Path(study[0]["results_dir"])
    at_hand = tmp_path / "results"
    for folder in ("checkpoints", "rl"):
        shutil.copytree(results / folder, at_hand / folder)
    (at_hand / "checkpoints" / "A" / "sft" / "model.safetensors").write_text("retrained")
    with pytest.raises(CheckFailed, match="checkpoint A sft 42 hashes to .*not the evaluated weights"):
        verifier.check_rerun(1, 0, at_hand)  # the first pick is the plan's first evaluation, A's reference


def test_a_bundle_with_its_weights_reruns_from_them(study: tuple[dict[str, Any], Path, Path], tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    from predict.bundle.build import build_bundle
    from predict.bundle.verify import Verifier
    from predict.campaign import config_hash
    from predict.fingerprint import input_identity

    config, bundle, ledger = study
    results = Path(config["results_dir"])
    weighted = {**config, "bundle": {"weights": True}}
    assert config_hash(weighted) == config_hash(config)  # what the bundle holds is no new design
    written = build_bundle(weighted, files=[results / rel for rel in manifest(bundle)["files"] if rel != "ledger.jsonl"],
                           data_manifest=results / "data" / "manifest.json", out_dir=tmp_path / "bundle",
                           archive=tmp_path / "bundle.tar.gz", example=results / EXAMPLE, ledger=ledger)
    for entry in written["checkpoints"]:
        assert entry["weights"] == f"weights/{entry['path']}"
        assert input_identity(tmp_path / "bundle" / entry["weights"]) == entry["identity"]
    v = Verifier(tmp_path / "bundle", tmp_path / "work")
    for check in (v.check_manifest, v.check_files, v.check_split, v.check_ledger):
        check()
    seen: list[str] = []

    def replay(config: Any, picks: Any, models: Any, **kw: Any) -> list[dict[str, Any]]:
        seen.extend(models.values())
        return bundled_rows(tmp_path / "bundle", picks)

    monkeypatch.setattr("predict.bundle.rerun.replay_test_rollouts", replay)
    assert v.check_rerun(2, 0, None).startswith("rerun: 2 test rollouts re-executed")
    assert seen and all(Path(m).is_relative_to(tmp_path / "bundle" / "weights") for m in seen)


# -- the bundle stage refuses results the ledger does not vouch for ------------------------------------------------


def test_the_bundle_refuses_a_test_evaluation_the_ledger_does_not_record(study: tuple[dict[str, Any], Path, Path],
                                                                        tmp_path: Path) -> None:
    from predict.bundle.build import BundleError, build_bundle

    config, _, ledger = study
    results = Path(config["results_dir"])
    changed = tmp_path / "changed.parquet"
    shutil.copyfile(results / "eval/A/step2/test/seed42.parquet", changed)
    edit_table(changed, 0, "final_pass", True)
    copy = Path(shutil.copytree(results, tmp_path / "results", ignore=shutil.ignore_patterns("bundle*")))
    shutil.copyfile(changed, copy / "eval/A/step2/test/seed42.parquet")
    with pytest.raises(BundleError, match="eval/A/step2/test/seed42.parquet: no campaign in the ledger records"):
        build_bundle({**config, "results_dir": str(copy)}, files=sorted(copy.glob("eval/*/*/*/seed*.parquet")),
                     data_manifest=copy / "data" / "manifest.json", out_dir=copy / "bundle",
                     archive=copy / "bundle.tar.gz", ledger=ledger)


def test_the_inspect_logs_are_an_optional_part_listed_and_hashed(study: tuple[dict[str, Any], Path, Path],
                                                                  tmp_path: Path) -> None:
    """Issue 62: the Inspect logs (`predict inspect-logs`) go into the bundle under inspect/ when the workflow hands
    them over, listed and hashed like every file; the bundle is available with them (and checks out without them:
    every test above), and a log changed afterwards is named like any file."""
    from predict.bundle.build import build_bundle
    from predict.bundle.verify import CheckFailed, Verifier
    from predict.inspect_logs.stage import export
    from tests.bundle_study import bundled_files

    config, _, ledger = study
    results = Path(config["results_dir"])
    logs = tmp_path / "inspect"
    export(config, evals=[results / "eval"], tasks_files=[results / "data" / f"{s}.parquet" for s in ("val", "test")],
           out_dir=logs, ledger=ledger)
    bundle = tmp_path / "bundle"
    build_bundle(config, files=[results / rel for rel in bundled_files(config)],
                 data_manifest=results / "data" / "manifest.json", out_dir=bundle, archive=tmp_path / "bundle.tar.gz",
                 example=results / EXAMPLE, ledger=ledger, inspect_logs=logs)
    data = manifest(bundle)
    assert data["report"]["inspect_logs"] == "inspect/"
    held = {rel for rel in data["files"] if rel.startswith("inspect/")}
    assert held == {f"inspect/{p.relative_to(logs).as_posix()}" for p in logs.rglob("*") if p.is_file()}
    assert {"inspect/logs.json", "inspect/A/step2/test/seed42.eval", "inspect/B/step2/val/seed42.eval"} <= held
    # the level the logs take part in (the others re-derive the numbers from the rows alone: tests above)
    checks = Verifier(bundle, tmp_path / "work")
    assert "files:" in checks.check_manifest() + checks.check_files() and checks.check_complete()
    log = bundle / "inspect" / "A" / "step2" / "test" / "seed42.eval"
    log.write_bytes(log.read_bytes() + b"\0")
    with pytest.raises(CheckFailed, match="inspect/A/step2/test/seed42.eval: sha256"):
        checks.check_files()


def test_values_compare_bit_for_bit() -> None:
    from predict.bundle.rederive import same, table_difference

    assert same(float("nan"), float("nan")) and same([1.0, {"a": 2}], [1.0, {"a": 2}])
    assert not same(0.0, -0.0) and not same(0.1 + 0.2, 0.3) and not same(1, 1.0) and not same(True, 1)
    a = pa.table({"run": ["A", "B"], "seed": [42, 42], "p": [0.5, 0.25]})
    b = pa.table({"run": ["A", "B"], "seed": [42, 42], "p": [0.5, math.nextafter(0.25, 1)]})
    assert table_difference("t", a, a) == (4, None)
    numbers, difference = table_difference("t", a, b)
    assert numbers == 3 and difference.startswith("t row 1 (run=B, seed=42): p is 0.25 in the bundle, 0.25000000000000")


def test_the_rerun_server_is_sized_as_the_evaluations_was(study: tuple[dict[str, Any], Path, Path], verifier: Any,
                                                          tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The real replay (the other rerun tests stand it in) opens its vLLM server as `predict evaluate` does: the
    config's serving section, not shared, and env.concurrency sequences in flight (the rows depend on the batch; the
    landed CI died here when the server's size became a required argument)."""
    from predict.bundle.rerun import replay_test_rollouts
    from predict.config.models import ServingSettings

    opened: list[tuple[dict[str, Any], dict[str, Any]]] = []

    class Opened(Exception):
        pass

    class RecordingServer:
        def __init__(self, serving: dict[str, Any], log: Path, **kw: Any) -> None:
            opened.append((serving, kw))

        def __enter__(self) -> Any:
            raise Opened

        def __exit__(self, *exc: Any) -> None:
            return None

    config = study[0]
    monkeypatch.setattr("predict.evaluate.CheckpointServer", RecordingServer)
    monkeypatch.setattr("predict.rollouts.sandbox_isolation", lambda config: None)
    with pytest.raises(Opened):
        replay_test_rollouts(config, [], {}, tasks_path=verifier.test_tasks, selection=[], ledger=study[2],
                             scratch=tmp_path / "scratch")
    [(serving, kw)] = opened
    assert serving == ServingSettings.model_validate({**config["serving"], "shared": None})  # the typed section
    assert kw == {"sequences": int(config["env"]["concurrency"])}


def test_a_gpu_rerun_difference_says_what_can_make_gpu_rows_differ(study: tuple[dict[str, Any], Path, Path],
                                                                    verifier: Any, tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 59: on a GPU, vLLM's own attention kernels, and a server that compiled its graphs where the campaign's
    loaded them (or the reverse), can change greedy rows; a difference found by --rerun says so (and names the
    rerun server's side), a CPU bundle's does not."""
    from predict.bundle.rerun import RERUN_LOG, gpu_rerun_note
    from predict.bundle.verify import CheckFailed
    from predict.config import load_config
    from predict.serving.server import serving_settings

    gpu = load_config(Path(__file__).resolve().parents[1] / "config" / "gpu-slice.yaml")["serving"]
    compiled = tmp_path / "compiled.log"
    compiled.write_text("INFO [backends.py:393] Compiling a graph for compile range (1, 8192) takes 13.11 s\n")
    loaded = tmp_path / "loaded.log"
    loaded.write_text("INFO [backends.py:292] Directly load the compiled graph(s) for compile range (1, 8192) from "
                      "the cache, took 0.890 s\n")
    note = gpu_rerun_note(serving_settings({**gpu, "evaluation_attention_backend": None}), compiled)
    assert "vLLM's choice of attention kernels" in note and "compiled its graphs on an empty compile cache" in note
    note = gpu_rerun_note(serving_settings(gpu), loaded)  # TRITON_ATTN set: only the compile cache is named
    assert "attention kernels" not in note and "loaded its compiled graphs" in note
    assert gpu_rerun_note(serving_settings(gpu), tmp_path / "no.log") == ""
    config, bundle, _ = study
    assert gpu_rerun_note(serving_settings(config["serving"]), compiled) == ""  # the CPU: rows repeat on any server

    def replay(config: Any, picks: Any, models: Any, **kw: Any) -> list[dict[str, Any]]:
        rows = bundled_rows(bundle, picks)
        (kw["scratch"] / RERUN_LOG).parent.mkdir(parents=True, exist_ok=True)
        (kw["scratch"] / RERUN_LOG).write_text(compiled.read_text())  # where verify-bundle reads the server's log
        return [{**rows[0], "final_outcome": "TIMEOUT"}, *rows[1:]]

    monkeypatch.setattr("predict.bundle.rerun.replay_test_rollouts", replay)
    bundled = verifier.bundled()
    monkeypatch.setattr(verifier, "bundled", lambda: bundled.model_copy(
        update={"serving": serving_settings({**gpu, "evaluation_attention_backend": None})}))
    with pytest.raises(CheckFailed) as failed:
        verifier.check_rerun(1, 0, Path(config["results_dir"]))
    assert "re-executed: final_outcome" in str(failed.value)
    assert "on a GPU, the evaluation ran on vLLM's choice of attention kernels" in str(failed.value)
    assert "this re-execution's server compiled its graphs" in str(failed.value)
