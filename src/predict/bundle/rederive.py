"""Every statistics table and the report, re-derived from a bundle's evaluation rows by the project's own stages
(`predict stats`, `ablations`, `extensions`, `open-question`, `power`, `training-outcomes`, `report`), each run
in-process as its rule runs it, with its slice of the bundled config, into a scratch folder laid out like results/;
and the comparisons that name the first number that differs.

Rules:

* Each stage gets what its rule hands it (workflow/rules/stats.smk, report.smk): the val statistics every bundled val
  evaluation, the test statistics every bundled test evaluation against the re-derived val selection and the
  bundled ledger, each ablation's and extension's table and the open question every val evaluation (their stages
  read the runs they compare and leave the others), the power table the re-derived pairs, the report the re-derived
  tables, the bundled training metrics, the example evaluation the manifest names and the test split re-derived
  from MBPP. Every setting comes from the bundled config through the stage's slice, never from a default here.
* Tables are compared value by value (`table_difference`): the same columns and types, the same rows in the same
  order, floats bit for bit (NaN equals NaN; 0.0 is not -0.0). The bootstrap is seeded from the config, so it
  repeats exactly too.
* The report is compared as text (`report_difference`): the re-rendered page must equal the bundled one but for its
  build time; its figures are compared byte for byte where this matplotlib is the bundle's (else left out, said).
"""

from __future__ import annotations

import argparse
import html
import importlib
import math
import re
import struct
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa

if TYPE_CHECKING:
    from predict.stages import StageSettings

TABLE_FOLDERS = ("stats", "test/stats", "ablations", "extensions")
"""Where the bundle holds statistics tables (results paths)."""


def handed_config(config: Mapping[str, Any], name: str, work: Path) -> StageSettings:
    """The stage's config as the workflow hands it: its slice written and read back (`predict.stages.slice_file`,
    canonical JSON: sections in sorted key order, whatever order `config` has, so run order is the stage's own), as
    the typed object the stage's ``main`` takes (`predict.stages.stage_settings`, as the CLI gives it)."""
    from predict.config import load_config_slice
    from predict.stages import slice_file, stage_settings

    sliced = load_config_slice(slice_file(config, name, work / ".slices"))
    return stage_settings(name, sliced, source=f"stage {name!r}")


def run_stage(name: str, config: Mapping[str, Any], argv: Sequence[str], *, work: Path) -> None:
    """`predict <name> argv` in this process, as the rule runs it: the stage's own `arguments` and `main`, its
    config as the workflow hands it (`handed_config`), its console output swallowed; a stage that fails raises."""
    from predict.outputs import console
    from predict.stages import STAGES

    module, arguments, main = STAGES[name].command_functions()
    loaded = importlib.import_module(module)
    parser = argparse.ArgumentParser(prog=f"predict {name}")
    getattr(loaded, arguments)(parser)
    args = parser.parse_args([str(a) for a in argv])
    args.stage, args.config_slice = name, None
    with console.capture():
        code = getattr(loaded, main)(args, handed_config(config, name, work))
    if code:
        raise RuntimeError(f"predict {name} exited {code}")


def handed(bundle: Path, files: Sequence[str]) -> list[Path]:
    return [bundle / rel for rel in files]


def evaluations(bundle: Path, split: str) -> list[Path]:
    """The bundle's evaluation files of one split, sorted."""
    from predict.stats.metrics import EVAL_PATH

    return [p for p in sorted(bundle.glob("eval/*/*/*/seed*.parquet"))
            if (m := EVAL_PATH.search(p.as_posix())) and m["split"] == split]


def rederive_val(config: Mapping[str, Any], bundle: Path, work: Path, *, inputs: Mapping[str, Sequence[str]]) -> None:
    """The val statistics, the ablation, extension and open-question tables, the power and the training-outcome
    tables, from the bundle's val evaluations and training metrics, into `work` (laid out like results/).
    `inputs`: the manifest's record of the order the workflow handed its lists (predict.bundle: ``inputs``)."""
    from predict.runs import environments, run_matrix
    from predict.stats.open_question import OPEN_QUESTION, family_size

    val, stats = evaluations(bundle, "val"), work / "stats"
    matrix = run_matrix(config)
    run_stage("stats", config, ["--eval", *val, "--out-dir", stats], work=work)
    for name in matrix.ablations:
        run_stage("ablations", config, ["--ablation", name, "--eval", *val,
                                        "--out", work / "ablations" / f"{name}.parquet"], work=work)
    for name in matrix.extensions:
        run_stage("extensions", config, ["--extension", name, "--eval", *val,
                                         "--out", work / "extensions" / f"{name}.parquet"], work=work)
    run_stage("open-question", config, ["--eval", *val, "--out", work / "extensions" / f"{OPEN_QUESTION}.parquet"],
              work=work)
    family = family_size(environments(matrix), handed_config(config, "power", work).seeds)
    run_stage("power", config, ["--pairs", stats / "pairs.parquet", "--open-question-family", family,
                                "--out", stats / "power.parquet"], work=work)
    run_stage("training-outcomes", config, ["--rl-metrics", *handed(bundle, inputs["rl_metrics"]),
                                            "--out", stats / "training_outcomes.parquet"], work=work)


def rederive_test(config: Mapping[str, Any], bundle: Path, work: Path, *, ledger: Path) -> None:
    """The test statistics, from the bundle's test evaluations against the re-derived val selection and the
    campaign's `ledger`, into `work`."""
    run_stage("stats", config, ["--eval", *evaluations(bundle, "test"), "--selection", work / "stats" / "selection.parquet",
                                "--test-ledger", ledger, "--out-dir", work / "test" / "stats"], work=work)


PLAN_VS_RUN = "report/plan_vs_run.parquet"


def rederive_report(config: Mapping[str, Any], bundle: Path, work: Path, *, inputs: Mapping[str, Sequence[str]],
                    test_tasks: Path, example: str | None) -> None:
    """The report, from the re-derived tables in `work` (the ablations and extensions in the order the workflow
    handed them, `inputs`) and the bundle's training metrics, into `work`. `test_tasks`: the test split re-derived
    from MBPP (the report's task text); `example`: the evaluation the report renders a rollout from (a path under
    `bundle`)."""
    from predict.stats.open_question import OPEN_QUESTION

    stats = work / "stats"
    run_stage("report", config, [
        "--stats-dir", stats, "--test-stats", work / "test" / "stats",
        "--ablations", *handed(work, inputs["ablations"]), "--extensions", *handed(work, inputs["extensions"]),
        "--open-question", work / "extensions" / f"{OPEN_QUESTION}.parquet", "--power", stats / "power.parquet",
        *(["--example", bundle / example] if example else []), "--tasks-file", test_tasks,
        "--rl-metrics", *handed(bundle, inputs["rl_metrics"]), "--training-outcomes", stats / "training_outcomes.parquet",
        # the plan beside the run: measured times, not derived from the study's tables, shown as bundled
        *(["--plan-vs-run", bundle / PLAN_VS_RUN] if (bundle / PLAN_VS_RUN).is_file() else []),
        "--out", work / "report" / "index.html",
    ], work=work)


def handed_lists(files: Sequence[str]) -> dict[str, list[str]]:
    """The lists the workflow hands the report and the training-outcome stage, in the order it hands them (the
    bundle stage's ``--files`` order: ablations and extensions in config order, RL metrics in study order), which the
    stages' slices cannot tell (sorted JSON): the manifest's ``inputs``."""
    from predict.stats.open_question import OPEN_QUESTION

    return {"ablations": [f for f in files if re.fullmatch(r"ablations/[^/]+\.parquet", f)],
            "extensions": [f for f in files if re.fullmatch(r"extensions/[^/]+\.parquet", f)
                           and f != f"extensions/{OPEN_QUESTION}.parquet"],
            "rl_metrics": [f for f in files if re.fullmatch(r"rl/[^/]+/seed-?\d+/metrics\.parquet", f)]}


def tables(root: Path, folders: Sequence[str] = TABLE_FOLDERS) -> list[str]:
    """The statistics tables in these folders of a results-like folder, as results paths, in the order a reader
    meets them: folder by folder, each folder's tables as `predict.stats` orders them (metrics first: a changed
    row shows first where it names its evaluation), then by name."""
    from predict.stats import TEST_STATS_TABLES

    order = {name: i for i, name in enumerate(TEST_STATS_TABLES)}
    return [p.relative_to(root).as_posix() for folder in folders
            for p in sorted((root / folder).glob("*.parquet"), key=lambda p: (order.get(p.stem, len(order)), p.name))]


# -- comparing ------------------------------------------------------------------------------------------------------


def same(a: Any, b: Any) -> bool:
    """Equal, floats bit for bit (any NaN equals any NaN), lists and structs element by element."""
    if isinstance(a, float) and isinstance(b, float):
        return (math.isnan(a) and math.isnan(b)) or struct.pack("<d", a) == struct.pack("<d", b)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    return type(a) is type(b) and a == b


def is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def row_label(row: Mapping[str, Any], limit: int = 8) -> str:
    """What a statistics row is about: its text columns and seeds (run, checkpoint, kind, metric...)."""
    keys = [(k, v) for k, v in row.items() if isinstance(v, str) or (k.startswith("seed") and is_number(v))]
    return ", ".join(f"{k}={v}" for k, v in keys[:limit])


def table_difference(name: str, bundled: pa.Table, derived: pa.Table) -> tuple[int, str | None]:
    """(numbers compared, the first difference in words or None)."""
    if bundled.schema.names != derived.schema.names:
        extra = [c for c in bundled.schema.names if c not in derived.schema.names]
        missing = [c for c in derived.schema.names if c not in bundled.schema.names]
        return 0, (f"{name}: its columns differ from the re-derived table's (in the bundle only: {extra or 'none'}; "
                   f"re-derived only: {missing or 'none'})")
    for field in bundled.schema:
        if field.type != derived.schema.field(field.name).type:
            return 0, (f"{name}: column {field.name} is {field.type} in the bundle, "
                       f"{derived.schema.field(field.name).type} re-derived")
    if bundled.num_rows != derived.num_rows:
        return 0, f"{name}: {bundled.num_rows} rows in the bundle, {derived.num_rows} re-derived from the evaluation rows"
    numbers = 0
    for i, (b, d) in enumerate(zip(bundled.to_pylist(), derived.to_pylist(), strict=True)):
        for column in bundled.schema.names:
            if not same(b[column], d[column]):
                return numbers, (f"{name} row {i} ({row_label(d)}): {column} is {b[column]!r} in the bundle, "
                                 f"{d[column]!r} re-derived from the evaluation rows")
            numbers += is_number(b[column])
    return numbers, None


# -- the report -----------------------------------------------------------------------------------------------------

BUILT = re.compile(r"built \d{4}-\d\d-\d\d \d\d:\d\d UTC")
IMAGE = re.compile(r'src="data:image/png;base64,([^"]*)"')
NUMBER = re.compile(r"[-+]?\d+(?:\.\d+)?(?:e[-+]?\d+)?%?")
SECTION_START = re.compile(r'<section id="([^"]+)">')


def report_pieces(page: str) -> tuple[list[tuple[str, str]], list[str]]:
    """The page's text pieces, each with the section it is in, its build time masked; and its figures (base64)."""
    images = IMAGE.findall(page)
    page = IMAGE.sub('src="(figure)"', BUILT.sub("built (time)", page))
    pieces, section = [], "(header)"
    for part in re.split(r"(<[^>]*>)", page):
        if match := SECTION_START.match(part):
            section = match.group(1)
        if part and not part.startswith("<"):
            pieces.append((section, html.unescape(part)))
        elif part.startswith("<img"):
            pieces.append((section, part))
    return pieces, images


def report_numbers(page: str) -> int:
    """How many numbers the page prints (in its text, past the navigation)."""
    return sum(len(NUMBER.findall(text)) for section, text in report_pieces(page)[0] if section != "(header)")


def report_difference(bundled: str, derived: str, *, compare_figures: bool) -> str | None:
    """The first place the bundled page differs from the re-rendered one, in words, or None."""
    mine, figures = report_pieces(bundled)
    theirs, derived_figures = report_pieces(derived)
    for i, ((section, text), (_, other)) in enumerate(zip(mine, theirs, strict=False)):
        if text != other:
            before = " ".join(t for _, t in mine[max(0, i - 3):i])[-120:]
            return (f"report/index.html: section {section}, after {before!r}: the page prints {text!r}, the "
                    f"report re-rendered from the re-derived tables prints {other!r}")
    if len(mine) != len(theirs):
        return f"report/index.html: {len(mine)} text pieces in the bundle, {len(theirs)} re-rendered"
    if compare_figures:
        for i, (a, b) in enumerate(zip(figures, derived_figures, strict=True)):
            if a != b:
                return f"report/index.html: figure {i + 1} differs from the one re-drawn from the bundled metrics"
    return None
