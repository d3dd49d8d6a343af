"""The documented offline `vf-eval` command (docs/vf-eval.md), run as written against a scripted endpoint, next to
our own `run_rollouts_sync` on the same tasks and replies.

One vf-eval run (``-r 2``) over five tasks whose scripted replies end in PASS, SYNTAX_ERROR, ASSERTION_FAILURE and
RUNTIME_ERROR, and one whose every call gets a 404 (a model name the server does not serve). The command comes from
the doc's code block; only the split, the endpoint and the output folder are swapped for the test's.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from predict.config import REPO_ROOT, load_config
from predict.data import MBPP_SCHEMA
from predict.env.protocol import STUB
from predict.env.runner import RolloutSettings, run_rollouts_sync
from predict.outputs import write_rows
from predict.stages import EPISODE_VIEW, stage_settings
from predict_mbpp.environment import STUDY_CONFIG
from tests.scripted_endpoint import HttpError, ScriptedEndpoint

DOC = REPO_ROOT / "docs" / "vf-eval.md"
SPLIT, ENDPOINT, OUT = "results/data/val.parquet", "http://127.0.0.1:8000/v1", "results/vf-eval"
"""What the documented command points at, swapped for the test's own."""
BUILTINS = {"set", "sorted", "math", "round", "abs", "len", "list", "tuple", "str", "int", "float", "sum", "max"}
OUTCOMES = ["PASS", "SYNTAX_ERROR", "ASSERTION_FAILURE", "RUNTIME_ERROR"]


def documented_command() -> list[str]:
    """The `vf-eval predict_mbpp ...` command of the doc's bash block (continuation lines joined)."""
    block = re.search(r"```bash\n(.*?)```", DOC.read_text(), flags=re.S)
    assert block, f"{DOC}: no bash block"
    lines = block.group(1).replace("\\\n", " ").splitlines()
    (command,) = [line for line in lines if line.strip().startswith("vf-eval predict_mbpp")]
    return shlex.split(command)


def patch_to(code: str) -> str:
    return "CALL apply_patch " + json.dumps({"find": STUB.strip(), "replace": code})


def script_for(outcome: str, row: Mapping[str, Any], name: str) -> list[str | HttpError]:
    code = {
        "PASS": row["code"],
        "SYNTAX_ERROR": f"def {name}(:\n    pass",
        "ASSERTION_FAILURE": f"def {name}(*args):\n    return 'not the answer'",
        "RUNTIME_ERROR": f"def {name}(*args):\n    raise ValueError('scripted')",
    }[outcome]
    return [patch_to(code), "FINAL: done"]


@pytest.fixture(scope="module")
def tasks(mbpp_rows: list[dict[str, Any]]) -> list[tuple[dict[str, Any], list[str | HttpError]]]:
    """(row, script): one task per outcome whose first assert calls the task's own function, then a failed call."""
    chosen = []
    for row in mbpp_rows:
        match = re.match(r"assert (\w+)\(", row["test_list"][0])
        if match and match.group(1) not in BUILTINS and not row.get("test_setup_code"):
            chosen.append((row, match.group(1)))
        if len(chosen) == len(OUTCOMES) + 1:
            break
    out = [(row, script_for(outcome, row, name)) for outcome, (row, name) in zip(OUTCOMES, chosen, strict=False)]
    out.append((chosen[-1][0], [HttpError(404, "The model `policy` does not exist.")]))
    return out


@pytest.fixture(scope="module")
def runs(tasks: list[tuple[dict[str, Any], list[Any]]], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("vf_eval")
    split = tmp / "val.parquet"
    write_rows([{k: row[k] for k in MBPP_SCHEMA.names} for row, _ in tasks], MBPP_SCHEMA, split)
    with ScriptedEndpoint({row["text"]: script for row, script in tasks}) as endpoint:
        argv = [
            {SPLIT: str(split), ENDPOINT: endpoint.base_url, OUT: str(tmp / "out")}.get(word, word)
            for word in documented_command()
        ]
        argv[0] = str(Path(sys.executable).with_name("vf-eval"))
        argv[argv.index("-n") + 1] = str(len(tasks))
        env = {**os.environ, "HOME": str(tmp / "home"), "PYTHONPATH": str(REPO_ROOT / "src")}
        done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=600, cwd=tmp)
        assert done.returncode == 0, done.stderr[-3000:]
        vf_requests = list(endpoint.requests)
        settings = RolloutSettings.from_study_config(
            stage_settings(EPISODE_VIEW, load_config(STUDY_CONFIG)),
            arm="A", seed=0, checkpoint="", base_url=endpoint.base_url, model="policy"
        )
        ours = run_rollouts_sync([row for row, _ in tasks], settings)
    (traces_file,) = (tmp / "out").glob("*/traces.jsonl")
    traces = [t for line in traces_file.read_text().splitlines() for t in json.loads(line)["traces"]]
    return {"traces": traces, "ours": ours, "argv": argv, "requests": vf_requests}


def outcome_of(trace: Mapping[str, Any]) -> tuple[Any, ...]:
    """What both clients must agree on, from a vf-eval trace."""
    info = trace["info"]
    reward = trace["rewards"]["tests_pass"]["score"] if trace["rewards"] else None
    steps = [s["action"] for s in (info.get("agent_result") or {}).get("steps") or []]
    return trace["ok"], reward, (info.get("final_verdict") or {}).get("outcome"), steps


def test_the_documented_command_runs_offline_with_the_study_settings(runs: dict[str, Any]) -> None:
    assert "--no-push" in runs["argv"] and "-m" in runs["argv"]
    study = load_config(STUDY_CONFIG)["env"]
    sampling = {r["model"]: r["sampling"] for r in runs["requests"]}
    # the served name, and the study's sampling (the seat defaults), on every call
    assert sampling == {"policy": {"temperature": study["temperature"], "max_tokens": study["max_tokens"]}}
    for trace in runs["traces"]:
        assert trace["agent"]["config"]["runtime"]["type"] == "subprocess"
        assert trace["agent"]["config"]["harness"]["id"] == "predict_mbpp"  # the taskset's own harness


def test_vf_eval_agrees_with_run_rollouts_sync(runs: dict[str, Any], tasks: list[Any]) -> None:
    by_task: dict[int, list[tuple[Any, ...]]] = {}
    for trace in runs["traces"]:
        by_task.setdefault(trace["task"]["data"]["task_id"], []).append(outcome_of(trace))
    ours = {
        r["task_id"]: (r["ok"], r["reward"], r["final_outcome"], [s["action"] for s in r["steps"]])
        for r in runs["ours"]
    }
    assert sorted(by_task) == sorted(ours)
    for task_id, outcomes in by_task.items():
        assert outcomes == [ours[task_id]] * 2, task_id
    finals = [ours[row["task_id"]][2] for row, _ in tasks]
    assert finals == [*OUTCOMES, None]  # the scripts reach every class; the failed call reaches none


def test_a_failed_model_call_is_an_errored_rollout_under_vf_eval(runs: dict[str, Any], tasks: list[Any]) -> None:
    failed_task = tasks[-1][0]["task_id"]
    failed = [t for t in runs["traces"] if t["task"]["data"]["task_id"] == failed_task]
    assert len(failed) == 2
    for trace in failed:
        assert (trace["ok"], trace["rewards"]) == (False, {})
        assert trace["errors"][-1]["type"] == "ProviderError" and trace["errors"][-1]["status_code"] == 404


def test_each_rollout_of_a_task_has_its_own_sample_and_key(runs: dict[str, Any]) -> None:
    keys = [t["task"]["key"] for t in runs["traces"]]
    assert len(keys) == len(set(keys)) == 2 * len({t["task"]["data"]["task_id"] for t in runs["traces"]})
    for trace in runs["traces"]:
        data = trace["task"]["data"]
        assert trace["task"]["key"] == f"mbpp-{data['task_id']}-{data['sample']}" and data["sample"] in (0, 1)
    # one task to vf-eval's resume: the repeats share the task's hash
    hashes: dict[int, set[str]] = {}
    for trace in runs["traces"]:
        hashes.setdefault(trace["task"]["data"]["task_id"], set()).add(trace["task"]["hash"])
    assert all(len(h) == 1 for h in hashes.values())


def test_a_missing_split_says_what_to_pass() -> None:
    from predict.env.taskset import MbppTaskset, MbppTasksetConfig

    with pytest.raises(ValueError, match=r"--env\.taskset\.path results/data/val\.parquet"):
        MbppTaskset(MbppTasksetConfig())
