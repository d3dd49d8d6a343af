"""The rules files read config only through typed objects and slices (predict.stages): SLICE, CONFIG and the
workflow's own view, WORKFLOW_CONFIG over stages.WORKFLOW. Nothing else touches Snakemake's `config`."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from predict.config import REPO_ROOT, load_config
from predict.stages import WORKFLOW, SliceError, workflow_config

# `config` itself: indexed, .get, passed to a function, or as a value (not `configfile:`, `--config-slice`,
# `params.config`, a "config" key, or a comment).
DIRECT = re.compile(r"""(?<![\w.\-"'])config(?=\s*[\[.,)])""")
# The one place the workflow hands `config` to the views: common.smk's validation, defaults and view definitions;
# and the plan that sizes the GPU rules (predict.plan.limits), which prices a job from the whole study as `predict
# plan` does.
VIEWS = ("config.update(with_defaults(config,", "workflow_config(config)",
         "slice_file(config,", "slice_params(config,", "stage_settings(stage, config,",
         "WorkflowLimits(config,")


def direct_reads(files: list[Path]) -> list[str]:
    hits = []
    for path in files:
        for number, line in enumerate(path.read_text().splitlines(), 1):
            code = line.split("#", 1)[0]
            if DIRECT.search(code) and not (path.name == "common.smk" and any(v in code for v in VIEWS)):
                shown = path.relative_to(REPO_ROOT) if path.is_relative_to(REPO_ROOT) else path.name
                hits.append(f"{shown}:{number}: {line.strip()}")
    return hits


def workflow_files() -> list[Path]:
    return [REPO_ROOT / "Snakefile", *sorted((REPO_ROOT / "workflow").rglob("*.smk"))]


def test_rules_read_config_only_through_views():
    hits = direct_reads(workflow_files())
    assert not hits, "rules reading `config` directly (use WORKFLOW_CONFIG or CONFIG(stage)):\n" + "\n".join(hits)


def test_the_scan_sees_direct_reads(tmp_path):
    rules = tmp_path / "workflow" / "x.smk"
    rules.parent.mkdir()
    rules.write_text('A = config["arms"]\nB = config.get("backend")\nC = study_runs(config)\n'
                     'D = WORKFLOW_CONFIG["arms"]  # config["x"] in a comment\nshell: "--config-slice {params.config:q}"\n')
    assert [h.split(":")[1] for h in direct_reads([rules])] == ["1", "2", "3"]


def test_the_workflow_object_refuses_keys_it_does_not_list():
    from predict.config.models import SelectionSettings

    view = workflow_config(load_config(REPO_ROOT / "config" / "config.yaml"))
    assert view.backend == "prime_rl" and view.sft.device == "gpu" and "rl.steps" in WORKFLOW
    assert view.evaluation.selection == SelectionSettings(mode="fixed", step=100)
    with pytest.raises(SliceError, match="'rl.lr'"):
        _ = view.rl.lr
    with pytest.raises(SliceError, match="'data'"):
        _ = view.data
