"""The stage table (src/predict/stages.py): each stage reads only its slice, and the README's table is the table."""

from __future__ import annotations

import copy
import json
import pickle
import re
from pathlib import Path

import pytest

from predict.cli import main
from predict.config import ConfigError, load_config
from predict.config.models import ArmSettings, RLSettings
from predict.stages import (
    STAGES,
    SliceError,
    config_slice,
    readme_table,
    slice_file,
    slice_params,
    stage_settings,
)

REPO = Path(__file__).resolve().parents[1]
CONFIGS = [REPO / "config" / "local.yaml", REPO / "config" / "config.yaml"]


def test_a_stage_refuses_a_key_outside_its_slice_and_names_stage_and_key() -> None:
    config = stage_settings("power", load_config(REPO / "config" / "local.yaml"))
    assert config.power.target == 0.8 and config.data.sizes.test == 500
    with pytest.raises(SliceError, match=r"stage 'power' read config key 'rl'.*stages\.py"):
        _ = config.rl
    with pytest.raises(SliceError, match="'data.mbpp_path'"):
        _ = config.data.mbpp_path  # a sibling of a key the table gives is still outside
    with pytest.raises(SliceError, match="'evaluation'"):
        "evaluation" in config  # noqa: B015 - membership is a read too


def test_the_typed_object_refuses_a_section_outside_the_row_and_names_stage_and_key() -> None:
    view = stage_settings("rl", load_config(REPO / "config" / "local.yaml"))
    with pytest.raises(SliceError, match=r"stage 'rl' read config key 'sft'.*stages\.py"):
        _ = view.sft
    with pytest.raises(SliceError, match="'model.base'"):
        _ = view.model.base  # a sibling of a key the table gives (model.enable_thinking) is still outside
    with pytest.raises(SliceError, match="'rft'"):
        getattr(view, "rft", None)  # a default does not hide a read outside the entry
    with pytest.raises(SliceError, match="'power'"):
        "power" in view  # noqa: B015 - membership is a read too
    with pytest.raises(AttributeError, match="no key 'model.bass'"):
        _ = view.model.bass  # a typo is not a missing key
    with pytest.raises(AttributeError, match="read-only"):
        view.model.enable_thinking = True


def test_a_typed_read_returns_the_model_type_and_the_plain_data_stays_the_slice() -> None:
    from predict.config.models import plain_data
    from predict.stages import stage_model

    config = load_config(REPO / "config" / "local.yaml")
    config["rl"]["lr"] = 1  # YAML's `lr: 1` is an int; the model's field is a float
    sliced = config_slice(config, "rft")
    view = stage_settings("rft", config)
    assert type(view) is stage_model("rft") and plain_data(view) == sliced
    assert json.dumps(plain_data(view)) == json.dumps(config_slice(config, "rft"))
    assert view.rl.lr == 1.0 and type(view.rl.lr) is float and sliced["rl"]["lr"] == 1
    assert type(view.rl.group_size) is int and view.rl.weight_sync in ("auto", "memory", "folder")
    assert isinstance(view.rl, RLSettings) and isinstance(view.arms["B"], ArmSettings)  # whole sections: the models
    assert view.arms["B"].protocol == config["arms"]["B"]["protocol"] and set(view.arms) == set(config["arms"])
    assert view.model.enable_thinking is config["model"]["enable_thinking"]
    assert view.env.test_cost == config["env"]["test_cost"]
    # a plain config mapping is read through the named stage's row
    assert stage_settings("rl", config).rl.steps == config["rl"]["steps"]
    assert stage_settings("rft", {k: v for k, v in config.items() if k != "rft"}).rft is None
    # a slice without any of the keys listed below a section (model.tiny): the section reads, those keys are left out
    tiny = stage_settings("build-tiny-model",
                          {k: v for k, v in config.items() if k != "model"} | {"model": {"base": "m"}})
    assert tiny.model.tiny is None and "tiny" not in tiny.model


def test_every_stage_gets_the_typed_view(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import predict.train.rl as rl

    seen = []
    monkeypatch.setattr(rl, "main", lambda args, config: seen.append(config) or 0)
    path = slice_file(load_config(REPO / "config" / "local.yaml"), "rl", tmp_path)
    main(["rl", "--config-slice", path, "--run", "B", "--seed", "1", "--init", str(tmp_path), "--tasks-file",
          str(tmp_path / "none.parquet"), "--out-dir", str(tmp_path / "out")])
    from predict.stages import stage_model

    assert type(seen[0]) is stage_model("rl")
    assert seen[0].rl.steps == load_config(REPO / "config" / "local.yaml")["rl"]["steps"]
    # issue 40: no stage's main takes the dict view any more; issue 61: each takes its own typed object
    from predict.stages import StageSettings

    config = load_config(REPO / "config" / "local.yaml")
    assert all(type(stage_settings(name, config)) is stage_model(name) for name in STAGES)
    assert all(issubclass(stage_model(name), StageSettings) for name in STAGES)


# The stages moved to the typed view with issue 40's last step: their `main`, the flags it needs, a key it reads and
# one outside its table entry.
TYPED_LATE = {
    "rollout": ("predict.rollouts", "main", ["--split", "val", "--model", "m", "--checkpoint", "base", "--arm", "A",
                                             "--seed", "1", "--out", "out.parquet"], "env", "rl"),
    "traces": ("predict.traces.stage", "traces_main", ["--out-dir", "out"], "traces", "serving"),
    "run-traces": ("predict.traces.stage", "run_traces_main", ["--run", "blind_A", "--arm-traces", "A.parquet",
                                                               "--out", "out.parquet"], "traces", "verifier"),
    "report": ("predict.report.stage", "main", ["--stats-dir", "stats", "--power", "power.parquet",
                                                "--out", "index.html"], "power", "evaluation"),
    "prime-rl-config": ("predict.train.prime_rl.cluster", "config_main", ["rl", "--model", "m", "--output-dir", "o",
                                                                        "--out", "o.toml"], "prime_rl", "power"),
    "signal": ("predict.train.learning_signal", "main", ["--out-dir", "out"], "rl", "evaluation"),
    # the bundle reads the whole config (STUDY): no key is outside its entry
    "bundle": ("predict.bundle.build", "main", ["--files", "f", "--data-manifest", "m.json", "--out-dir", "out",
                                                "--archive", "out.tar.gz"], "bundle", None),
}


@pytest.mark.parametrize("stage", sorted(TYPED_LATE))
def test_the_late_typed_stages_get_the_typed_view_and_refuse_keys_outside_their_entry(
    stage: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    import importlib

    module, name, argv, inside, outside = TYPED_LATE[stage]
    seen: list = []
    monkeypatch.setattr(importlib.import_module(module), name, lambda args, config: seen.append(config) or 0)
    config = load_config(REPO / "config" / "local.yaml")
    path = slice_file(config, stage, tmp_path)
    tasks = ["--tasks-file", str(tmp_path / "none.parquet")] if "tasks_file" in STAGES[stage].task_files or stage == "report" else []
    assert main([stage, "--config-slice", path, *tasks, *argv]) == 0
    view = seen[0]
    from predict.config.models import plain_data
    from predict.stages import stage_model, stage_settings

    assert type(view) is stage_model(stage)  # issue 61: its own typed object, its plain data the slice
    assert getattr(view, inside) == getattr(stage_settings(stage, config), inside)  # the models, as attributes
    assert plain_data(view) == config_slice(config, stage)  # the plain slice for fingerprints, unchanged
    if outside is None:
        return
    with pytest.raises(SliceError, match=rf"stage '{stage}' read config key '{outside}'.*stages\.py"):
        getattr(view, outside)


def test_the_trace_settings_are_the_typed_section_and_a_mix_mapping_counts_as_before() -> None:
    from predict.config.models import TraceMix, TracesSettings
    from predict.stages import stage_settings
    from predict.traces.stage import mix_counts, traces_settings

    config = load_config(REPO / "config" / "local.yaml")
    settings = traces_settings(stage_settings("traces", config))
    assert isinstance(settings, TracesSettings) and settings.n_recovery == config["traces"]["n_recovery"]
    # the typed mapping holds every class (the ones left out None): it counts as the mapping the config wrote
    mix = {"ASSERTION_FAILURE": 2, "TIMEOUT": 1}
    assert mix_counts(TraceMix(**mix), 7) == mix_counts(mix, 7) == {"ASSERTION_FAILURE": 5, "TIMEOUT": 2}


def test_a_listed_key_the_config_leaves_out_reads_as_its_default_or_none() -> None:
    from predict.config.models import PowerSettings

    sizes = {"sft": 1, "rl": 1, "test": 10}
    config = stage_settings("power", {"data": {"sizes": sizes}, "seeds": [1]})
    assert config.power == PowerSettings() and "power" in config  # a section with defaults reads as them
    with pytest.raises(ConfigError, match="required key .data. is missing"):  # a required key left out: refused
        stage_settings("power", {"data": {}, "seeds": [1]})


def test_the_typed_object_gives_its_plain_data_for_json_and_survives_pickle_and_copies() -> None:
    from predict.config.models import plain_data

    config = stage_settings("stats", load_config(REPO / "config" / "local.yaml"))
    assert json.loads(json.dumps(plain_data(config))) == config_slice(load_config(REPO / "config" / "local.yaml"),
                                                                      "stats")
    for clone in (pickle.loads(pickle.dumps(config)), copy.deepcopy(config)):
        assert clone == config and type(clone) is type(config)
        with pytest.raises(SliceError):
            _ = clone.evaluation.temperature


def test_dataclasses_asdict_copies_a_typed_section_whole() -> None:
    """asdict deep-copies what is no dataclass: a typed section must come out equal, not crash (a dict view crashed
    the test campaign inside a rollout job once), and its plain data is plain dicts."""
    import dataclasses

    from predict.config.models import plain_data

    @dataclasses.dataclass
    class Holder:
        evaluation: object

    config = stage_settings("stats", load_config(REPO / "config" / "local.yaml"))
    copied = dataclasses.asdict(Holder(config.evaluation))["evaluation"]
    assert copied == config.evaluation
    assert type(plain_data(copied)) is dict and type(plain_data(copied)["bootstrap"]) is dict


def _is_config_key(dotted: str) -> bool:
    """Whether a dotted key names a key of the config models (a section's entries, `arms.B`, by any name)."""
    from predict.config import sections_in
    from predict.config.models import StudyConfig

    model, entries = StudyConfig, None
    for part in dotted.split("."):
        if entries is not None:
            model, entries = entries, None
            continue
        if model is None or part not in model.model_fields:
            return False
        model, entries = sections_in(model.model_fields[part].annotation)
    return True


def test_every_key_a_table_lists_is_a_config_key() -> None:
    """The stage table, the workflow's view, the untracked keys and the campaign's design name real keys of the
    config models (old code: NOT_RESULT_SHAPING named a `report` section the config never had)."""
    from predict.campaign import NOT_RESULT_SHAPING
    from predict.stages import DESIGN, UNTRACKED, WORKFLOW

    listed = {f"stage {s.name}": s.reads for s in STAGES.values()} | {
        "WORKFLOW": WORKFLOW, "UNTRACKED": UNTRACKED, "DESIGN": DESIGN, "NOT_RESULT_SHAPING": NOT_RESULT_SHAPING}
    stale = [f"{where}: {key}" for where, keys in listed.items() for key in keys if not _is_config_key(key)]
    assert stale == [], "not config keys (src/predict/config/models.py):\n" + "\n".join(stale)


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_the_test_campaign_slice_is_the_whole_frozen_design(path: Path) -> None:
    from predict.campaign import config_hash, design_config

    config = load_config(path)
    sliced = config_slice(config, "evaluate-test")
    assert design_config(sliced) == design_config(config) and config_hash(sliced) == config_hash(config)


def test_slice_params_name_their_key_and_stay_short() -> None:
    config = load_config(REPO / "config" / "local.yaml")
    params = slice_params(config, "report")
    assert params["config_run_name"] == 'run_name="local"'
    assert params["config_arms"].startswith("arms#")
    assert all(len(v) < 80 for v in params.values())


def test_slice_file_is_content_addressed(tmp_path: Path) -> None:
    config = load_config(REPO / "config" / "local.yaml")
    first = slice_file(config, "power", tmp_path)
    assert slice_file(config, "power", tmp_path) == first
    changed = slice_file({**config, "power": {**config["power"], "target": 0.9}}, "power", tmp_path)
    assert changed != first and json.loads(Path(changed).read_text())["power"]["target"] == 0.9
    # a change outside the slice is the same file
    assert slice_file({**config, "rl": {**config["rl"], "lr": 1.0}}, "power", tmp_path) == first


def test_cli_reads_a_slice_file_and_refuses_a_wrong_slice(tmp_path: Path) -> None:
    config = load_config(REPO / "config" / "local.yaml")
    config["power"] = {**config["power"], "deltas": [0.05], "discordance": [0.2], "tasks": [250]}
    out = tmp_path / "power.parquet"
    assert main(["power", "--config-slice", slice_file(config, "power", tmp_path), "--out", str(out)]) == 0
    assert out.exists()
    # a slice missing what the stage needs fails with the stage's table named, not with a KeyError deep inside
    wrong = tmp_path / "wrong.json"
    wrong.write_text(json.dumps({"power": config["power"]}))
    assert main(["power", "--config-slice", str(wrong), "--out", str(tmp_path / "x.parquet")]) == 2


def test_every_rule_passes_a_slice_never_the_whole_config() -> None:
    files = {p.name: p.read_text() for p in (REPO / "workflow" / "rules").glob("*.smk")}
    assert not any("CONFIG_JSON" in t or "--config-json" in t for t in files.values())
    for stage in STAGES.values():
        text = files[stage.rules_file]
        for rule in stage.rules:
            # a rule per run is named in a loop (name: f"evaluate_{_run}")
            if "{" in rule:
                looped = 'f"' + rule.replace("{run}", "{_run}") + '"'
                pattern = r"^\s*name:\s*\n\s*" + re.escape(looped)
            else:
                pattern = rf"^\s*(?:rule|checkpoint) {rule}:"
            start = re.search(pattern, text, re.M)
            assert start, f"rule {rule} of stage {stage.name} not in {stage.rules_file}"
            body = re.split(r"^\s*(?:rule|checkpoint)\b", text[start.end():], maxsplit=1, flags=re.M)[0]
            shell = body if "predict" in body else text  # a shared shell string (TEST_CAMPAIGN_SHELL)
            assert f"predict {stage.name.removesuffix('-test')}" in shell, f"rule {rule}: not `predict {stage.name}`"
            if "params.config" in body or "SLICE(" in body:
                assert f'**SLICE("{stage.name}")' in body, f"rule {rule}: not its stage's slice"


def test_readme_stage_table_is_the_stage_table() -> None:
    readme = (REPO / "README.md").read_text()
    assert readme_table() in readme, "README's stage table is stale: paste predict.stages.readme_table()"
    for stage in STAGES.values():
        assert (REPO / "workflow" / "rules" / stage.rules_file).exists()
        assert (REPO / "src" / "predict" / stage.module).exists()


def test_every_stage_command_lives_where_the_table_says_and_takes_its_slice() -> None:
    """cli.py registers each stage from the table: its module's `arguments` and `main`, behind the one config
    source group (--config / --config-json / --config-slice), and holds no stage of its own."""
    import argparse
    import importlib

    from predict.cli import build_parser

    commands = {s.name for s in STAGES.values() if s.command is not None}
    assert commands == set(STAGES) - {"evaluate-test"}  # `predict evaluate --split test`
    for name in commands:
        module, arguments, stage_main = STAGES[name].command_functions()
        loaded = importlib.import_module(module)
        assert callable(getattr(loaded, arguments)) and callable(getattr(loaded, stage_main)), name
    (sub,) = [a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    # and the commands that are no workflow stage (no rule, no slice): configs, serving, verifying a bundle, the plan
    assert set(sub.choices) == commands | {"check-config", "config-schema", "serve", "verify-bundle", "plan"}
    for name in commands:
        flags = {flag for action in sub.choices[name]._actions for flag in action.option_strings}
        assert {"--config", "--config-json", "--config-slice"} <= flags, name


def test_listing_the_stages_imports_no_stage_module() -> None:
    """`predict --help` stays fast: only the named stage's module is imported."""
    import subprocess
    import sys

    code = ("import sys; from predict.cli import build_parser; build_parser(['--help']); "
            "print(' '.join(sorted(m for m in sys.modules if m.startswith('predict.'))))")
    loaded = set(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split())
    heavy = {"predict.train.sft", "predict.train.rl", "predict.evaluate", "predict.stats.study",
             "predict.report.stage", "predict.train.prime_rl.cluster", "predict.traces.stage", "predict.tiny_model"}
    assert "predict.cli" in loaded and not loaded & heavy, loaded & heavy


def test_a_stage_with_a_slice_of_the_wrong_stage_fails_in_one_line(tmp_path: Path, capsys) -> None:
    """verify-gold reads verifier.* from its slice (no flags of config values any more): a slice without them is
    an error naming the stage and the key, exit 2."""
    (tmp_path / "empty.json").write_text("{}")
    args = ["verify-gold", "--config-slice", str(tmp_path / "empty.json"), "--data-dir", str(tmp_path)]
    assert main([*args, "--out", str(tmp_path / "g.parquet"), "--summary-out", str(tmp_path / "s.parquet")]) == 2
    assert re.search(r"stage 'verify-gold': .*the required key 'verifier' is missing",
                     " ".join(capsys.readouterr().err.split()))


def test_a_stage_object_types_its_keys_without_the_rest_of_their_sections() -> None:
    """What the library code reads instead of int()/float() casts (issues 40, 61): a YAML 1 for a float key is 1.0,
    an int key stays an int, and a section's keys the row does not list (here RLSettings' required ones, for
    rl.mask_decision alone) are not asked for."""
    from predict.runs import resolve_run
    from predict.stages import RUNS_VIEW, stage_settings

    config = {"arms": {"A": {"protocol": "reactive"}, "B": {"protocol": "predictive", "alpha": 1}},
              "env": {"test_cost": 1}, "ablations": {"b_alpha": {"alpha": 2}}, "rl": {"mask_decision": True}}
    matrix = stage_settings(RUNS_VIEW, config)
    assert matrix.arms["B"].alpha == 1.0 and isinstance(matrix.arms["B"].alpha, float)
    assert matrix.env.test_cost == 1 and isinstance(matrix.env.test_cost, int) and matrix.rl.mask_decision is True
    # a run matrix alone resolves (resolve_run reads env.test_cost and the overlays' alpha through the models)
    del config["rl"]
    spec = resolve_run(config, "b_alpha")
    assert (spec.alpha, spec.test_cost, spec.mask_decision) == (2.0, 1, False) and isinstance(spec.alpha, float)


# -- each stage's own typed object (issue 61) ------------------------------------------------------------------------


def _keys_of(model: type, prefix: str = "") -> set[str]:
    """The dotted keys a stage model holds: a `StageSettings` part by its keys, any other field whole."""
    from predict.stages import StageSettings

    out = set()
    for name, field in model.model_fields.items():
        part = next((a for a in (field.annotation, *getattr(field.annotation, "__args__", ()))
                     if isinstance(a, type) and issubclass(a, StageSettings)), None)
        out |= _keys_of(part, f"{prefix}{name}.") if part is not None else {prefix + name}
    return out


@pytest.mark.parametrize("stage", sorted(STAGES))
def test_each_stage_model_holds_exactly_the_keys_its_row_lists(stage: str) -> None:
    """A stage's model is built from its row: a key given whole is its section model, keys below a section are a
    model of those keys alone; a key covered by a whole section it also lists is that section's."""
    from predict.stages import stage_model

    reads = STAGES[stage].reads
    listed = {key for key in reads if not any(key.startswith(other + ".") for other in reads)}
    assert _keys_of(stage_model(stage)) == listed


@pytest.mark.parametrize("path", [*CONFIGS, REPO / "config" / "gpu-slice.yaml", REPO / "config" / "gpu-rehearsal.yaml"],
                         ids=lambda p: p.name)
def test_the_plain_data_of_a_stage_object_is_its_slice_byte_for_byte(path: Path) -> None:
    """What is hashed or written goes through `plain_data`: for every stage of every shipped config, the typed
    object's plain data is the slice the workflow writes, the same JSON bytes (key order included)."""
    from predict.config.models import plain_data
    from predict.stages import stage_settings

    config = load_config(path)
    for stage in STAGES:
        sliced = config_slice(config, stage)
        assert json.dumps(plain_data(stage_settings(stage, sliced))) == json.dumps(sliced), stage


def test_plain_data_keeps_an_int_the_config_wrote_for_a_float_and_reads_a_changed_key_as_it_is() -> None:
    """A YAML ``lr: 1`` reads as the float 1.0 but hashes as 1 (the bytes fingerprints and ledgers were written
    under); a key changed on the typed object (a run's test_cost) is plain data as changed; a key the config leaves
    out stays out."""
    from predict.config.models import plain_data
    from predict.stages import stage_settings

    config = load_config(REPO / "config" / "local.yaml")
    config["rl"]["lr"] = 1
    config["evaluation"]["temperature"] = 0
    config["evaluation"].pop("tasks", None)
    rl = stage_settings("rl", config)
    assert rl.rl.lr == 1.0 and isinstance(rl.rl.lr, float)
    assert plain_data(rl)["rl"]["lr"] == 1 and isinstance(plain_data(rl)["rl"]["lr"], int)
    evaluate = stage_settings("evaluate", config)
    assert json.dumps(plain_data(evaluate)["evaluation"]) == json.dumps(config_slice(config, "evaluate")["evaluation"])
    assert "tasks" not in plain_data(evaluate)["evaluation"] and evaluate.evaluation.tasks is None
    changed = evaluate.model_copy(update={"env": evaluate.env.model_copy(update={"test_cost": 3})})
    assert plain_data(changed)["env"]["test_cost"] == 3
    assert plain_data(changed)["env"] == {**config_slice(config, "evaluate")["env"], "test_cost": 3}


def test_a_stage_object_refuses_a_key_outside_its_row_and_names_stage_and_key() -> None:
    from predict.stages import stage_settings

    evaluate = stage_settings("evaluate", load_config(REPO / "config" / "local.yaml"))
    with pytest.raises(SliceError, match=r"stage 'evaluate' read config key 'sft'.*stage table"):
        _ = evaluate.sft
    with pytest.raises(SliceError, match=r"'model\.base'"):  # the row gives model.enable_thinking alone
        _ = evaluate.model.base
    assert evaluate.model.enable_thinking is True and evaluate.rl.mask_decision is False


def test_a_stage_object_is_typed_all_the_way_down_and_frozen() -> None:
    """Sections are the study's own models (`RLSettings`, `ArmSettings`); a section a slice leaves out reads as its
    defaults where the row lists only keys with defaults (model.tiny), as None where it has none (rft)."""
    import pydantic

    from predict.config.models import TinyModelSettings
    from predict.stages import stage_settings

    config = load_config(REPO / "config" / "local.yaml")
    rft = stage_settings("rft", config)
    assert isinstance(rft.rl, RLSettings) and isinstance(rft.arms["B"], ArmSettings)
    assert stage_settings("rft", {k: v for k, v in config.items() if k != "rft"}).rft is None
    tiny = stage_settings("build-tiny-model", {**config, "model": {"base": "m"}})
    assert tiny.model.tiny is None and tiny.model.model_copy().tiny is None
    assert stage_settings("build-tiny-model", config).model.tiny == TinyModelSettings.model_validate(config["model"]["tiny"])
    with pytest.raises(AttributeError, match="read-only"):
        rft.rl = None  # type: ignore[misc]
    with pytest.raises(pydantic.ValidationError):  # a section inside is frozen too
        rft.rl.lr = 0.5  # type: ignore[misc]


def test_a_bad_slice_fails_naming_the_source_and_the_key() -> None:
    from predict.config import ConfigError
    from predict.stages import stage_settings

    config = load_config(REPO / "config" / "local.yaml")
    config["rl"]["lr"] = "fast"
    with pytest.raises(ConfigError, match=r"^slice\.json: rl\.lr"):
        stage_settings("rl", config, source="slice.json")
