"""Every config default is written once, in predict.config.models: config/schema.yaml states the same ones (checked
here key by key), load_config fills them in, and no other code writes a literal default for a config key."""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from predict.config import REPO_ROOT, SCHEMA_PATH, field_default, has_default, load_config, sections_in, with_defaults
from predict.config.models import Section, StudyConfig


def _schema_object(node: dict[str, Any]) -> dict[str, Any] | None:
    """The object schema a property holds (itself, or its one object-typed branch such as `[object, "null"]`)."""
    if "properties" in node:
        return node
    for branch in node.get("oneOf", []) + node.get("anyOf", []):
        if isinstance(branch, dict) and "properties" in branch:
            return branch
    return None


def _entries_schema(node: dict[str, Any]) -> dict[str, Any] | None:
    """The schema of a mapping's entries (arms: patternProperties; ablations, extensions: additionalProperties)."""
    for pattern in node.get("patternProperties", {}).values():
        return pattern
    extra = node.get("additionalProperties")
    return extra if isinstance(extra, dict) else None


def _compare(model: type[Section], schema: dict[str, Any], path: str, problems: list[str]) -> None:
    props = schema.get("properties", {})
    if set(props) != set(model.model_fields):
        problems.append(f"{path or '<top>'}: schema keys {sorted(set(props) - set(model.model_fields))} not in the "
                        f"model, model keys {sorted(set(model.model_fields) - set(props))} not in the schema")
    required = set(schema.get("required", []))
    for name, field in model.model_fields.items():
        if name not in props:
            continue
        prop, where = props[name], f"{path}{name}"
        if field.is_required() != (name in required):
            problems.append(f"{where}: required in {'the model' if field.is_required() else 'the schema'} only")
        if has_default(field) != ("default" in prop):
            problems.append(f"{where}: a default in {'the model' if has_default(field) else 'the schema'} only")
        elif has_default(field) and field_default(field) != prop["default"]:
            problems.append(f"{where}: model default {field_default(field)!r} != schema default {prop['default']!r}")
        section, entries = sections_in(field.annotation)
        if section and (sub := _schema_object(prop)) is not None:
            _compare(section, sub, where + ".", problems)
        elif section and name != "mix":
            problems.append(f"{where}: a section in the model, not an object in the schema")
        if entries and (sub := _entries_schema(prop)) is not None:
            _compare(entries, sub, where + ".*.", problems)


def test_schema_and_models_agree_on_every_key_and_default():
    schema = yaml.safe_load(SCHEMA_PATH.read_text())
    problems: list[str] = []
    _compare(StudyConfig, schema, "", problems)
    assert not problems, "config/schema.yaml and src/predict/config/models.py disagree:\n" + "\n".join(problems)


def test_the_comparison_sees_a_drifted_default(monkeypatch):
    schema = yaml.safe_load(SCHEMA_PATH.read_text())
    schema["properties"]["env"]["properties"]["test_cost"]["default"] = 2
    problems: list[str] = []
    _compare(StudyConfig, schema, "", problems)
    assert problems == ["env.test_cost: model default 1 != schema default 2"]


MINIMAL = {
    "run_name": "t", "results_dir": "results",
    "data": {"mbpp_path": "m.jsonl", "split_seed": 0, "sizes": {"sft": 1, "rl": 1, "test": 1}},
    "verifier": {"timeout_s": 3, "memory_mb": 512, "workers": 1, "outcome_labels": "structured"},
    "model": {"base": "tiny"}, "serving": {"device": "gpu", "shared": None}, "env": {"budget": 8, "rollout_tasks": None},
    "arms": {"A": {"protocol": "reactive"}, "B": {"protocol": "predictive", "alpha": 1.0}}, "seeds": [1],
    "sft": {"lr": 1e-3, "epochs": 1, "batch_tokens": 64},
    "extensions": {"x": {"base_arm": "A"}},
}


def test_defaults_fill_missing_keys_of_present_sections_and_keep_nulls():
    config = with_defaults(MINIMAL)
    assert config["env"]["test_cost"] == 1 and config["env"]["temperature"] == 1.0
    assert config["sft"]["device"] == "auto" and config["sft"]["max_seq_len"] is None
    assert config["serving"]["shared"] is None  # an explicit null stays null
    assert config["env"]["rollout_tasks"] is None and "budget_neutral_budget" not in config["env"]
    assert config["extensions"]["x"] == {"base_arm": "A", "variant": "none", "trainer": "rl"}
    assert config["evaluation"]["selection"] == {"mode": "fixed", "step": 100}  # a section that must exist
    assert config["tracking"] == {"tensorboard": True, "wandb": {"mode": "disabled", "project": "predict", "entity": None}}
    assert "rft" not in config and "tiny" not in config["model"] and "rl" not in config  # optional sections stay out
    assert MINIMAL["env"] == {"budget": 8, "rollout_tasks": None}  # the input is not changed
    assert with_defaults(config) == config


@pytest.mark.parametrize("name", ["config.yaml", "local.yaml"])
def test_loaded_configs_carry_every_default(name):
    config = load_config(REPO_ROOT / "config" / name)
    typed = StudyConfig.model_validate(config)
    assert typed.env.test_cost == config["env"]["test_cost"]
    assert typed.evaluation.bootstrap.resamples == config["evaluation"]["bootstrap"]["resamples"]


# ---------------------------------------------------------------------------------------------------------------
# No literal default of a config key outside the models.

def _config_keys() -> set[str]:
    keys: set[str] = set()

    def walk(model: type[Section]) -> None:
        for name, field in model.model_fields.items():
            keys.add(name)
            section, entries = sections_in(field.annotation)
            for sub in (section, entries):
                if sub is not None:
                    walk(sub)

    walk(StudyConfig)
    # Names too common to mean a config key (a task's or a row's seed, a record's split...) are only flagged when
    # the literal is a config default of that name.
    return keys


LITERAL = r"""(?:-?\d[\d_.e-]*|True|False|"[^"]*"|'[^']*'|\[[^\]]*\]|\{[^}]*\}|\([^)]*\))"""
FORMS = [
    # x.get("key", <literal>) — the literal default of a key (an empty {} / None for a section left out is allowed)
    re.compile(r"""\.get\(\s*["'](?P<key>[a-z_]+)["']\s*,\s*(?P<lit>""" + LITERAL + r""")\s*\)"""),
    # x.get("key") or <literal>
    re.compile(r"""\.get\(\s*["'](?P<key>[a-z_]+)["']\s*\)\s*or\s+(?P<lit>""" + LITERAL + r""")"""),
    # x["key"] or <literal>
    re.compile(r"""\[\s*["'](?P<key>[a-z_]+)["']\s*\]\s*or\s+(?P<lit>""" + LITERAL + r""")"""),
    # {"key": <literal>, **config...}: defaults spread under a config section
    re.compile(r"""\{\s*["'](?P<key>[a-z_]+)["']\s*:\s*(?P<lit>""" + LITERAL + r""")\s*,[^}]*\*\*"""),
]
EMPTY = {"{}", "None", "[]", "()", '""', "''"}
SCANNED = [REPO_ROOT / "src" / "predict", REPO_ROOT / "workflow", REPO_ROOT / "Snakefile"]
# Receivers that hold data, not config, whose fields share a config key's name (a record's seed, a row's ok...).
DATA_RECEIVERS = {"row", "record", "records", "r", "s", "entry", "e", "meta", "summary", "task", "extra", "info",
                  "totals", "metrics", "out_metrics", "state", "message", "models", "args", "wildcards", "result"}


# A line that writes a default of its own under a config key's name says so (a signal run's own model size).
NOT_CONFIG_MARK = "not a config default"
# A copy kept where the config stack cannot be imported (the agent program's protocol): checked equal below.
MIRROR_MARK = re.compile(r"mirrors the config default \((?P<model>\w+)\.(?P<key>\w+)\)")


def _receiver(before: str) -> str:
    match = re.search(r"(\w+)(?:\[[^\]]*\])?\s*$", before)
    return match[1] if match else ""


# A module constant holding a config key's default (BATCH_INVARIANT_DEFAULT = True, DEFAULT_SELECTION = {...}).
DEFAULT_CONSTANT = re.compile(r"^\s*(?P<name>[A-Z_]*DEFAULT[A-Z_]*)\s*(?::[^=]+)?=\s*(?P<lit>" + LITERAL + ")")
# A class field repeating a config default under the key's name (`eps_low: float = 0.2` in a dataclass).
DATACLASS_FIELD = re.compile(r"^\s+(?P<key>[a-z_]+)\s*:\s*[^=()]+=\s*(?P<lit>" + LITERAL + r")\s*(?:#.*)?$")


def _literal(text: str) -> Any:
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return object()


def _defaults_by_key() -> dict[str, list[Any]]:
    """{key name: its defaults in the models} (several sections share a name: seed, lr, ...), unset ones left out."""
    out: dict[str, list[Any]] = {}

    def walk(model: type[Section]) -> None:
        for name, field in model.model_fields.items():
            section, entries = sections_in(field.annotation)
            if has_default(field) and not section:
                out.setdefault(name, []).append(field_default(field))
            for sub in (section, entries):
                if sub is not None:
                    walk(sub)

    walk(StudyConfig)
    return out


def _shown(path: Path) -> str:
    return str(path.relative_to(REPO_ROOT)) if path.is_relative_to(REPO_ROOT) else path.name


def _sources() -> list[Path]:
    files: list[Path] = []
    for root in SCANNED:
        files += [root] if root.is_file() else sorted(p for p in root.rglob("*") if p.suffix in (".py", ".smk"))
    return [p for p in files if "config/models.py" not in p.as_posix()]


def literal_defaults(files: list[Path] | None = None) -> list[str]:
    """file:line: text of every literal default written for a config key outside predict.config.models."""
    keys, hits, defaults = _config_keys(), [], _defaults_by_key()
    for path in files or _sources():
        lines = path.read_text().splitlines()
        for number, line in enumerate(lines, 1):
            if NOT_CONFIG_MARK in line or MIRROR_MARK.search(line):
                continue
            for form in FORMS:
                # a dict of defaults spread under a section may close on the next line: `{"a": 1,\n **section}`
                text = f"{line} {lines[number].strip()}" if form is FORMS[3] and number < len(lines) else line
                for match in form.finditer(text):
                    if match.start() >= len(line):
                        continue
                    if match["key"] not in keys or match["lit"] in EMPTY:
                        continue
                    if form is FORMS[0] and _receiver(line[: match.start()]) in DATA_RECEIVERS:
                        continue
                    hits.append(f"{_shown(path)}:{number}: {line.strip()[:120]}")
            if (constant := DEFAULT_CONSTANT.match(line)) and any(
                    key in constant["name"].lower().replace("default", "").strip("_").split("__") for key in keys):
                hits.append(f"{_shown(path)}:{number}: {line.strip()[:120]}")
            if (field := DATACLASS_FIELD.match(line)) and _literal(field["lit"]) in defaults.get(field["key"], []):
                hits.append(f"{_shown(path)}:{number}: {line.strip()[:120]}")
    return hits


def test_no_literal_default_of_a_config_key_outside_the_models():
    hits = literal_defaults()
    assert not hits, ("defaults of config keys written outside src/predict/config/models.py (read the key from the "
                      "config, where load_config filled it in, or a typed section):\n" + "\n".join(hits))


def test_the_scan_sees_each_form(tmp_path):
    sample = tmp_path / "sample.py"
    sample.write_text('a = env.get("test_cost", 1)\nb = cfg.get("target") or 0.8\nc = ev["reference"] or "sft"\n'
                      'd = {"resamples": 10_000, **boot}\ne = config.get("evaluation") or {}\n'
                      'f = {"deltas": [0.1], "target": 0.8,\n     **power}\n'
                      'BATCH_INVARIANT_DEFAULT = True\nDEFAULT_API_KEY_VAR = "X"\n'
                      'class C:\n    eps_low: float = 0.2\n    eps_low_other: float = 0.2\n    kl_coef: float = 0.5\n')
    assert [h.split(":")[1] for h in literal_defaults([sample])] == ["1", "2", "3", "4", "6", "8", "11"]


def test_mirrored_defaults_equal_the_models():
    from predict.config import models

    mirrors = []
    for path in _sources():
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if (mark := MIRROR_MARK.search(line)) and (field := DATACLASS_FIELD.match(line)):
                model = getattr(models, mark["model"])
                mirrors.append((f"{_shown(path)}:{number}", _literal(field["lit"]),
                                field_default(model.model_fields[mark["key"]])))
    assert len(mirrors) == 4  # env/protocol.py's ProtocolConfig
    assert [m for m in mirrors if m[1] != m[2]] == []
