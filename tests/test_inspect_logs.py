"""Every episode browsable (issue 62, predict.inspect_logs): evaluations as Inspect logs that inspect-ai's own reader
reads back sample for sample equal to the parquet rows (counts, scores, the messages' text), the messages being what
the model was sent; the arms paired task by task; `inspect view` serving them in a real browser; and bad input (a
folder with no evaluation, another record schema, a test file the ledger does not record, a val file holding test
tasks) refused in one line with nothing written. The study is small and synthetic (tests/synthetic.py rows played
through the real protocol; the real split, ledger and campaign)."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.bundle_study import registry
from tests.chromium import CHROMIUM, chromium
from tests.synthetic import (
    A_FAIL,
    A_PASS,
    FAIL_KEEP,
    FAIL_REVISE,
    PASS_KEEP,
    PASS_REVISE,
    record_campaign,
    rollout,
    write_eval,
)

REPO = Path(__file__).resolve().parents[1]
INSPECT = Path(sys.executable).with_name("inspect")
# Per run, one script per task (tests/synthetic.py): A passes, recovers, fails, applies nothing; B keeps a passing
# patch, revises a failing one then passes, revises a passing one then keeps a failing one, keeps a failing one.
SCRIPTS = {"A": [[A_PASS], [A_FAIL, A_PASS], [A_FAIL], []],
           "B": [[PASS_KEEP], [FAIL_REVISE, PASS_KEEP], [PASS_REVISE, FAIL_KEEP], [FAIL_KEEP]]}


def _infrastructure_failure(task_id: int, **kw: Any) -> dict[str, Any]:
    """A row without a verdict (the model server failed), as build_record writes it."""
    from predict.env.records import build_record

    meta = {"arm": "B", "protocol": "predictive", "variant": "none", "model": "synthetic", "client": "eval",
            "budget": 8, "revise_costs_call": True, **kw}
    return build_record(meta=meta, task={"task_id": task_id, "split": kw["split"]}, agent_result=None,
                        final_verdict=None, reward=None, ok=False, error="model server unavailable", wall_s=0.1)


@pytest.fixture(scope="module")
def study(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A results folder: the real split, A and B on 5 val tasks at sft and step2, and on 4 test tasks at step2 (the
    test campaign recorded in its own ledger); B's step2 val has an infrastructure failure on its fifth task."""
    from predict.bundle.rederive import run_stage
    from predict.config import load_config
    from predict.data import load_split

    root = tmp_path_factory.mktemp("inspect-study")
    ledger = root / "ledger.jsonl"
    config = load_config(REPO / "config" / "local.yaml")
    config["results_dir"] = str(root / "results")
    config["data"]["mbpp_path"] = str(REPO / config["data"]["mbpp_path"])
    results = root / "results"
    with registry(ledger):
        run_stage("split", config, ["--out-dir", results / "data"], work=root)
    splits = {s: sorted(load_split(results / "data" / f"{s}.parquet"), key=lambda r: r["task_id"]) for s in ("val", "test")}
    files: dict[tuple[str, str, str], Path] = {}
    for run, scripts in SCRIPTS.items():
        for split, checkpoints in (("val", ("sft", "step2")), ("test", ("step2",))):
            for ckpt in checkpoints:
                rows = [rollout(task["task_id"], script, arm=run, seed=42, checkpoint=ckpt, split=split)
                        for task, script in zip(splits[split], scripts, strict=False)]
                if (run, ckpt, split) == ("B", "step2", "val"):
                    rows.append(_infrastructure_failure(splits["val"][4]["task_id"], seed=42, checkpoint=ckpt,
                                                        split=split))
                files[run, ckpt, split] = write_eval(results / "eval", run, ckpt, 42, rows, split=split)
    test = [files["A", "step2", "test"], files["B", "step2", "test"]]
    selection = [{"run": r, "seed": 42, "checkpoint": "step2"} for r in ("A", "B")]
    with registry(ledger):
        record_campaign(ledger, config, test, selection)
    return {"config": config, "results": results, "ledger": ledger, "files": files,
            "tasks": [results / "data" / "val.parquet", results / "data" / "test.parquet"]}


@pytest.fixture(scope="module")
def exported(study: dict[str, Any]) -> Path:
    from predict.inspect_logs.stage import export

    out = study["results"] / "inspect"
    export(study["config"], evals=[study["results"] / "eval"], tasks_files=study["tasks"], out_dir=out,
           ledger=study["ledger"])
    return out


def _cli(study: dict[str, Any], *argv: str) -> list[str]:
    return ["inspect-logs", "--config-json", json.dumps(study["config"]), "--test-ledger", str(study["ledger"]),
            "--tasks-file", *map(str, study["tasks"]), *argv]


# -- the logs are the rows ------------------------------------------------------------------------------------------


def test_every_log_reads_back_with_inspect_ai_equal_to_its_parquet_rows(study: dict[str, Any], exported: Path) -> None:
    from inspect_ai.log import list_eval_logs, read_eval_log

    from predict.data import load_split
    from predict.env.protocol import ProtocolConfig, task_prompt

    tasks = {t["task_id"]: t for path in study["tasks"] for t in load_split(path)}
    logs = {Path(info.name.removeprefix("file:")).relative_to(exported.resolve()).as_posix()
            for info in list_eval_logs(str(exported))}
    assert logs == {f"{r}/{c}/{s}/seed42.eval" for r, c, s in study["files"]}
    manifest = json.loads((exported / "logs.json").read_text())
    assert set(manifest) == logs  # Inspect's own manifest of the folder, names relative to it
    for (run, ckpt, split), parquet in study["files"].items():
        rows = pq.read_table(parquet).to_pylist()
        log = read_eval_log(str(exported / run / ckpt / split / "seed42.eval"))
        assert log.status == "success" and len(log.samples) == len(rows) == log.results.total_samples
        scored = [r["final_pass"] for r in rows if r["final_pass"] is not None]
        assert log.results.scores[0].metrics["pass@1"].value == sum(scored) / len(scored)
        assert log.eval.task_args == {"run": run, "checkpoint": ckpt, "split": split, "seed": 42}
        for i, (row, sample) in enumerate(zip(rows, log.samples, strict=True)):
            assert (sample.id, sample.epoch) == (row["task_id"], row["sample"] + 1)
            assert sample.metadata["rollout_key"] == row["rollout_key"] and sample.metadata["parquet_row"] == i
            final = sample.scores.get("final_pass")
            assert (final.value if final else None) == {True: "C", False: "I", None: None}[row["final_pass"]]
            assert (sample.error is not None) == (not row["ok"])
            assert sample.scores["first_patch"].value == (row["first_patch_outcome"] or "no patch")
            assert (sample.scores["recovered"].value if "recovered" in sample.scores else None) == \
                {True: "C", False: "I", None: None}[row["recovered"]]
            assert sample.scores["calls_used"].value == row["calls_used"]
            assert sample.scores["stop_reason"].value == row["stop_reason"]
            assert ("forced_revises" in sample.scores) == (run == "B")
            # the messages' text: the protocol's system prompt, the task, then each reply and each answer sent
            config = ProtocolConfig.resolve(protocol="predictive" if run == "B" else "reactive")
            task = tasks[row["task_id"]]
            expected = [("system", config.system_prompt()), ("user", task_prompt(task["text"], task["test_list"]))]
            for step in row["steps"] or []:
                expected.append(("assistant", step["reply"]))
                expected += [("user", step["result"])] if step["result_sent"] and step["result"] is not None else []
            assert [(m.role, m.text) for m in sample.messages] == expected
            patches = [s for s in row["steps"] or [] if s["applied"]]
            assert [(p["prediction"], p["decision"], p["outcome"]) for p in sample.metadata["patches"]] == \
                [(p["prediction"], p["decision"], p["outcome"]) for p in patches]


def test_the_arms_pair_task_by_task_with_the_same_sample_id(study: dict[str, Any], exported: Path) -> None:
    from inspect_ai.log import read_eval_log

    for ckpt, split in (("sft", "val"), ("step2", "val"), ("step2", "test")):
        a = read_eval_log(str(exported / "A" / ckpt / split / "seed42.eval"))
        b = read_eval_log(str(exported / "B" / ckpt / split / "seed42.eval"))
        assert a.eval.metadata["paired_with"] == f"B/{ckpt}/{split}/seed42.eval"
        assert b.eval.metadata["paired_with"] == f"A/{ckpt}/{split}/seed42.eval"
        by_id = {s.id: s for s in b.samples}
        values = []
        for sample in a.samples:
            other = by_id[sample.id]  # the same task, the same sample id in the other arm's log
            expected = {("C", "C"): "both pass", ("I", "I"): "both fail", ("C", "I"): "only A passes",
                        ("I", "C"): "only B passes"}[sample.scores["final_pass"].value, other.scores["final_pass"].value]
            assert sample.scores["pair"].value == other.scores["pair"].value == expected
            assert sample.metadata["pair"]["run"] == "B" and other.metadata["pair"]["run"] == "A"
            assert sample.metadata["pair"]["final_pass"] == (other.scores["final_pass"].value == "C")
            values.append(expected)
        # A: pass, recover, fail, no patch; B: pass, pass after a REVISE, fail, fail
        assert values == ["both pass", "both pass", "both fail", "both fail"]
        assert {m.name: m.value for m in a.results.scores[-1].metrics.values()} == {"both pass": 2, "both fail": 2}
    # B's fifth val task failed on infrastructure: no verdict, no pair score, an error in the viewer
    failed = read_eval_log(str(exported / "B" / "step2" / "val" / "seed42.eval")).samples[-1]
    assert failed.error is not None and "final_pass" not in failed.scores and "pair" not in failed.scores


def test_the_messages_are_what_the_model_was_sent() -> None:
    """An episode through the program's own loop (predict.env.program.run_episode) with a chat that records every
    request: the sample's messages are the last request and the reply to it, and the answer to the budget-ending
    call, which never reached the model, is kept in that reply's metadata, not as a message."""
    from predict.env.program import run_episode
    from predict.env.protocol import ProtocolConfig, task_prompt
    from predict.env.records import build_record
    from predict.inspect_logs.episodes import messages
    from predict.vocabulary import Outcome

    replies = iter(['CALL apply_patch {"find": "# Write your function here.", "replace": "def f(): return 1"}',
                    "<PREDICTION>ASSERTION_FAILURE</PREDICTION> <DECISION>REVISE</DECISION>",
                    'CALL read_file {"file_path": "solution.py"}',
                    'CALL apply_patch {"find": "# Write your function here.", "replace": "def f(): return 2"}',
                    "<PREDICTION>PASS</PREDICTION> <DECISION>KEEP</DECISION>",
                    'CALL python_test {"project_path": "solution.py"}'])

    class Chat:
        seed_key, seeds, sent = None, None, []

        def __call__(self, msgs: list[dict[str, str]]) -> str:
            self.sent.append([dict(m) for m in msgs])
            return next(replies)

    task = {"task_id": 7, "text": "Write f.", "test_list": ["assert f() == 2"]}
    config = ProtocolConfig.resolve(protocol="predictive", budget=4)
    chat = Chat()
    _, episode, result = run_episode(config, lambda code: Outcome.PASS if "2" in code else Outcome.ASSERTION_FAILURE,
                                     chat, prompt=task_prompt(task["text"], task["test_list"]))
    assert episode.stop_reason == "budget" and not episode.steps[-1].result_sent
    row = build_record(meta={"arm": "B", "seed": 1, "checkpoint": "step1", "protocol": "predictive", "variant": "none",
                             "split": "val"}, task=task, agent_result=result, final_verdict={"outcome": "PASS"},
                       reward=1.0, ok=True, error=None, wall_s=0.1)
    got = messages(row, task)
    assert [{"role": m.role, "content": m.text} for m in got] == [*chat.sent[-1], {"role": "assistant",
                                                                                  "content": episode.steps[-1].reply}]
    assert got[-1].metadata["answer_not_sent"] == episode.steps[-1].result
    assert "predicted ASSERTION_FAILURE" in got[4].metadata["labels"] and "REVISE" in got[4].metadata["labels"]


# -- the seal and bad input: one line, nothing written ----------------------------------------------------------------


def _refused(study: dict[str, Any], capsys: pytest.CaptureFixture, out: Path, *argv: str) -> str:
    from predict.cli import main

    assert main(_cli(study, *argv, "--out-dir", str(out))) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and err.startswith("error:"), err
    assert not out.exists() and not out.with_name(f".{out.name}.partial").exists()
    return err


def test_a_folder_with_no_evaluation_is_refused(study: dict[str, Any], tmp_path: Path,
                                                capsys: pytest.CaptureFixture) -> None:
    (tmp_path / "empty" / "A").mkdir(parents=True)
    err = _refused(study, capsys, tmp_path / "out", "--evals", str(tmp_path / "empty"))
    assert f"{tmp_path / 'empty'}: no evaluation under it" in err


def test_a_parquet_of_another_schema_version_is_refused(study: dict[str, Any], tmp_path: Path,
                                                        capsys: pytest.CaptureFixture) -> None:
    """An older record schema: no request_seeds column, and steps without today's fields."""
    table = pq.read_table(study["files"]["A", "sft", "val"]).drop_columns(["request_seeds"])
    old = tmp_path / "eval" / "A" / "sft" / "val" / "seed42.parquet"
    old.parent.mkdir(parents=True)
    pq.write_table(table, old)
    err = _refused(study, capsys, tmp_path / "out", "--evals", str(old))
    assert f"{old}: not a rollout file of this version's record schema" in err and "lacks request_seeds" in err
    pq.write_table(pq.read_table(study["files"]["A", "sft", "val"]).set_column(
        1, "trace_id", pa.array([1] * table.num_rows, pa.int64())), old)  # a column of another type
    assert "trace_id is int64, not string" in _refused(study, capsys, tmp_path / "out", "--evals", str(old))


def test_a_test_file_the_ledger_does_not_record_is_refused(study: dict[str, Any], tmp_path: Path,
                                                           capsys: pytest.CaptureFixture) -> None:
    """A test evaluation changed after the campaign recorded it (one outcome flipped), or a recorded one under
    another run's path: neither is what the ledger records done."""
    recorded = study["files"]["A", "step2", "test"]
    changed = tmp_path / "eval" / "A" / "step2" / "test" / "seed42.parquet"
    changed.parent.mkdir(parents=True)
    rows = pq.read_table(recorded).to_pylist()
    rows[0]["final_pass"] = not rows[0]["final_pass"]
    pq.write_table(pa.Table.from_pylist(rows, schema=pq.read_schema(recorded)), changed)
    err = _refused(study, capsys, tmp_path / "out", "--evals", str(changed))
    assert f"{changed}: not a test evaluation that {study['ledger']} records as done (no campaign wrote it" in err
    moved = tmp_path / "eval" / "B" / "step2" / "test" / "seed42.parquet"  # A's recorded file under B's path
    moved.parent.mkdir(parents=True)
    shutil.copy(recorded, moved)
    err = _refused(study, capsys, tmp_path / "out", "--evals", str(moved))
    assert f"{moved}: not a test evaluation" in err and "the ledger records it as A step2 seed 42" in err
    err = _refused(study, capsys, tmp_path / "out", "--evals", str(recorded), "--test-ledger",
                   str(tmp_path / "no-ledger.jsonl"))
    assert f"{tmp_path / 'no-ledger.jsonl'} is missing" in err


def test_val_evaluations_holding_test_tasks_are_refused(study: dict[str, Any], tmp_path: Path,
                                                        capsys: pytest.CaptureFixture) -> None:
    """The test rows under a val path: the seal refuses their tasks, whatever the file says."""
    rows = [{**r, "split": "val"} for r in pq.read_table(study["files"]["A", "step2", "test"]).to_pylist()]
    val = write_eval(tmp_path / "eval", "A", "step2", 42, rows, split="val")
    err = _refused(study, capsys, tmp_path / "out", "--evals", str(val))
    assert f"{val}: 4 of its 4 tasks are test tasks" in err and "`predict inspect-logs` never reads a test task" in err


def test_the_export_folder_is_replaced_whole_and_never_a_foreign_one(study: dict[str, Any], tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture) -> None:
    foreign = tmp_path / "out"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    from predict.cli import main

    assert main(_cli(study, "--evals", str(study["files"]["A", "sft", "val"]), "--out-dir", str(foreign))) == 2
    assert "notes.txt, which no export wrote" in capsys.readouterr().err
    assert (foreign / "notes.txt").read_text() == "mine"


# -- the viewer ----------------------------------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def _page_text(url: str, wanted: list[str], png: Path, timeout_s: float) -> str:
    """Open `url` in headless Chromium (its DevTools protocol) until the page's text holds every one of `wanted` or
    the time is up; screenshot it to `png`; its text."""
    import aiohttp

    with chromium("--remote-debugging-port=0", "--window-size=1400,900", "about:blank",
                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) as (_, profile):
        deadline = time.monotonic() + timeout_s
        port_file = Path(profile) / "DevToolsActivePort"
        while not (port_file.exists() and port_file.read_text().strip()) and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        port = port_file.read_text().split()[0]
        async with aiohttp.ClientSession() as http:
            targets = await (await http.get(f"http://127.0.0.1:{port}/json")).json()
            page = next(t for t in targets if t["type"] == "page")
            async with http.ws_connect(page["webSocketDebuggerUrl"], max_msg_size=0) as ws:
                calls = 0

                async def call(method: str, **params: Any) -> dict[str, Any]:
                    nonlocal calls
                    calls += 1
                    await ws.send_json({"id": calls, "method": method, "params": params})
                    while (msg := await ws.receive_json()).get("id") != calls:
                        pass
                    return msg.get("result") or {}

                await call("Page.navigate", url=url)
                text = ""
                while time.monotonic() < deadline and not all(w in text for w in wanted):
                    await asyncio.sleep(0.5)
                    result = await call("Runtime.evaluate", expression="document.body ? document.body.innerText : ''")
                    text = result.get("result", {}).get("value") or ""
                shot = await call("Page.captureScreenshot", format="png")
                png.write_bytes(base64.b64decode(shot["data"]))
                return text


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (apt-get install -y chromium)")
def test_inspect_view_serves_the_logs_and_a_sample_shows_its_messages_and_scores(study: dict[str, Any],
                                                                                  exported: Path) -> None:
    """`inspect view` on the export folder, a real browser on one of Arm B's test samples (the task whose first patch
    a forced REVISE discarded): its task prompt, its replies and tool answers, and its scores are on the page."""
    from predict.data import load_split

    rows = pq.read_table(study["files"]["B", "step2", "test"]).to_pylist()
    row = rows[1]  # FAIL_REVISE then PASS_KEEP (and Arm A recovered on it: both pass)
    task = {t["task_id"]: t for t in load_split(study["tasks"][1])}[row["task_id"]]
    port = _free_port()
    server = subprocess.Popen([str(INSPECT), "view", "start", "--log-dir", str(exported), "--port", str(port),
                               "--host", "127.0.0.1"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            assert server.poll() is None, server.stdout.read().decode()
            time.sleep(0.3)
        url = f"http://127.0.0.1:{port}/#/logs/B/step2/test/seed42.eval/samples/sample/{row['task_id']}/1/messages"
        wanted = [task["text"], row["steps"][1]["reply"], "patch reverted", "final_pass", "forced_revises",
                  "both pass", "ASSISTANT"]
        png = exported.parent / "inspect-view.png"
        text = asyncio.run(_page_text(url, wanted, png, timeout_s=60))
        assert all(w in text for w in wanted), [w for w in wanted if w not in text]
        assert png.stat().st_size > 10_000  # a drawn page, not a blank one
        if keep := os.environ.get("PREDICT_INSPECT_SCREENSHOT"):
            shutil.copy(png, keep)
    finally:
        server.terminate()
        server.wait(timeout=30)
