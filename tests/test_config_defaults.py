"""Every config default is written once, in predict.config.models: config/schema.yaml is generated from the models
(held equal here, and checked key by key), load_config fills the defaults in, and no other code writes a literal
default for a config key."""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from predict.config import REPO_ROOT, SCHEMA_PATH, field_default, has_default, load_config, sections_in, with_defaults
from predict.config.models import Section, StudyConfig
from predict.config.schema import schema, schema_text


def _schema_object(node: dict[str, Any]) -> dict[str, Any] | None:
    """The object schema a property holds (itself, or its one object-typed branch such as `mix`'s mapping)."""
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
        elif section:
            problems.append(f"{where}: a section in the model, not an object in the schema")
        if entries and (sub := _entries_schema(prop)) is not None:
            _compare(entries, sub, where + ".*.", problems)


def test_the_schema_file_is_generated_from_the_models():
    assert SCHEMA_PATH.read_text() == schema_text(), (
        "config/schema.yaml is not what the config models (src/predict/config/models.py) generate: edit the models, "
        "then run `predict config-schema`")


def test_the_generated_schema_states_every_key_required_key_and_default_of_the_models():
    problems: list[str] = []
    _compare(StudyConfig, yaml.safe_load(SCHEMA_PATH.read_text()), "", problems)
    assert not problems, "config/schema.yaml and src/predict/config/models.py disagree:\n" + "\n".join(problems)


def test_the_comparison_sees_a_drifted_default():
    drifted = schema()
    drifted["properties"]["env"]["properties"]["test_cost"]["default"] = 2
    problems: list[str] = []
    _compare(StudyConfig, drifted, "", problems)
    assert problems == ["env.test_cost: model default 1 != schema default 2"]


@pytest.mark.parametrize("name", ["config.yaml", "local.yaml"])
def test_snakemake_validate_with_the_schema_agrees_with_the_models(name, tmp_path):
    """The generated file is a working JSON schema: Snakemake's `validate` passes the shipped configs, fills in the
    defaults the models fill in, and refuses what the models refuse."""
    from snakemake.exceptions import WorkflowError
    from snakemake.utils import validate

    raw = yaml.safe_load((REPO_ROOT / "config" / name).read_text())
    filled = json_copy(raw)
    validate(filled, str(SCHEMA_PATH))
    assert filled == load_config(REPO_ROOT / "config" / name)
    for edit in (lambda c: c["env"].update(budget=0), lambda c: c["arms"]["B"].update(alpha=None),
                 lambda c: c.update(seeds=[1, 1]), lambda c: c["rl"].update(weight_sync="shm"),
                 lambda c: c["arms"].update(b={"protocol": "reactive"})):
        bad = json_copy(raw)
        edit(bad)
        with pytest.raises(WorkflowError):
            validate(bad, str(SCHEMA_PATH))


def json_copy(value: Any) -> Any:
    return json.loads(json.dumps(value))


def test_no_field_has_two_descriptions():
    """A field's description is its Field(description=...) or the docstring under it, never both (pydantic would
    keep the first and drop the docstring silently, from the models and the schema)."""
    tree = ast.parse((REPO_ROOT / "src" / "predict" / "config" / "models.py").read_text())
    both = []
    for cls in (n for n in tree.body if isinstance(n, ast.ClassDef)):
        for field, after in zip(cls.body, cls.body[1:], strict=False):
            documented = isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant)
            if isinstance(field, ast.AnnAssign) and documented and "description=" in ast.unparse(field.annotation):
                both.append(f"{cls.name}.{ast.unparse(field.target)}")
    assert both == []


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
#
# Five forms are scanned: a default read from a config dict (`.get("key", 1)`, `c["key"] or 1`, `{"key": 1, **c}`),
# a function parameter (`resamples: int = 10_000,` on a line of its own or not), a class field (a dataclass's
# `wandb_mode: str = "disabled"`), a module or class constant (`DEFAULT_SIGNIFICANCE = 0.05`, `MAX_TOKENS = 512`)
# and an argparse option (`add_argument("--max-model-len", default=4096)`). A name means a config key when it is the
# key's name, or the key's name after its sections' (`wandb_mode` for tracking.wandb.mode, `bootstrap_seed`), with
# `default_`/`_default` around it; it is a repeat when its value is that key's default in the models (a `seed: int = 0`
# is one: 0 is the bootstrap's and SFT's default seed). None and empty containers are never defaults here.

LITERAL = r"""(?:-?\d[\d_.e-]*|True|False|"[^"]*"|'[^']*'|\[[^\]]*\]|\{[^}]*\}|\([^)]*\))"""
FORMS = [
    # x.get("key", <literal>) — the literal default of a key (an empty {} / None for a section left out is allowed)
    re.compile(r"""\.get\(\s*["'](?P<key>[a-z_]+)["']\s*,\s*(?P<lit>""" + LITERAL + r""")\s*\)"""),
    # x.get("key") or <literal>, also at the end of a chain: x.get("key") or x.get("other") or <literal>
    re.compile(r"""\.get\(\s*["'](?P<key>[a-z_]+)["']\s*\)(?:\s*or\s+[\w.]+\.get\([^)]*\))*\s*or\s+(?P<lit>"""
               + LITERAL + r""")"""),
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


def _sections() -> list[type[Section]]:
    """The study config's model and every section model below it (an entry's too: arms, ablations...), once each."""
    found: list[type[Section]] = []

    def walk(model: type[Section]) -> None:
        found.append(model)
        for field in model.model_fields.values():
            for sub in sections_in(field.annotation):
                if sub is not None and sub not in found:
                    walk(sub)

    walk(StudyConfig)
    return found


def _config_keys() -> set[str]:
    """Every key name of the models (a section's too)."""
    return {name for model in _sections() for name in model.model_fields}


def _defaults_by_name() -> dict[str, list[tuple[str, Any]]]:
    """{a name code may give a config key: [(the key's dotted path, its default)]}: the key's own name, and its name
    after its sections' names (`wandb_mode`, `bootstrap_resamples`, `isolation_require`); unset defaults left out."""
    out: dict[str, list[tuple[str, Any]]] = {}

    def walk(model: type[Section], path: tuple[str, ...]) -> None:
        for name, field in model.model_fields.items():
            section, entries = sections_in(field.annotation)
            here = (*path, name)
            if has_default(field) and not section:
                named = [part for part in here if part != "*"]
                for start in range(len(named)):
                    out.setdefault("_".join(named[start:]), []).append((".".join(here), field_default(field)))
            if section is not None:
                walk(section, here)
            if entries is not None:
                walk(entries, (*here, "*"))

    walk(StudyConfig, ())
    return out


def _plain(value: Any) -> Any:
    """A literal compared as config data: tuples as lists, a bool never equal to a number."""
    if isinstance(value, tuple | list):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return (type(value) is bool, value)


def _repeats(name: str, node: ast.expr | None, names: dict[str, list[tuple[str, Any]]]) -> list[str]:
    """The config keys whose default `name = node` repeats (none: it repeats no default)."""
    if node is None:
        return []
    try:
        value = ast.literal_eval(node)
    except (ValueError, SyntaxError, TypeError):
        return []
    if value is None or (isinstance(value, tuple | list | dict | str) and not value):
        return []
    name = name.lower().lstrip("_")
    candidates = {name, name.removeprefix("default_"), name.removesuffix("_default")}
    return sorted({key for c in candidates for key, default in names.get(c, []) if _plain(value) == _plain(default)})


def _argparse_name(call: ast.Call) -> str | None:
    """The option an `add_argument(...)` call defines (its dest, or its first `--long` flag), if it is one."""
    if not (isinstance(call.func, ast.Attribute) and call.func.attr == "add_argument"):
        return None
    for keyword in call.keywords:
        if keyword.arg == "dest" and isinstance(keyword.value, ast.Constant):
            return str(keyword.value.value)
    flags = [a.value for a in call.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
    long = [f for f in flags if f.startswith("--")]
    return long[0][2:].replace("-", "_") if long else None


def _python_repeats(path: Path, names: dict[str, list[tuple[str, Any]]]) -> list[tuple[int, str]]:
    """(line, key) of every parameter, class field, module or class constant and argparse option of a Python file
    whose literal default is a config key's default."""
    tree = ast.parse(path.read_text(), filename=str(path))
    found: list[tuple[int, str]] = []

    def check(name: str, value: ast.expr | None, line: int) -> None:
        if keys := _repeats(name, value, names):
            found.append((line, " or ".join(keys)))

    def assignments(body: list[ast.stmt]) -> None:
        for statement in body:
            if isinstance(statement, ast.AnnAssign) and isinstance(statement.target, ast.Name):
                check(statement.target.id, statement.value, statement.lineno)
            elif isinstance(statement, ast.Assign):
                for target in statement.targets:
                    if isinstance(target, ast.Name):
                        check(target.id, statement.value, statement.lineno)

    assignments(tree.body)
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            positional = node.args.posonlyargs + node.args.args
            pairs = list(zip(positional[len(positional) - len(node.args.defaults):], node.args.defaults, strict=True))
            pairs += list(zip(node.args.kwonlyargs, node.args.kw_defaults, strict=True))
            for arg, default in pairs:
                check(arg.arg, default, arg.lineno)
        elif isinstance(node, ast.ClassDef):
            assignments(node.body)
        elif isinstance(node, ast.Call) and (option := _argparse_name(node)):
            for keyword in node.keywords:
                if keyword.arg == "default":
                    check(option, keyword.value, keyword.value.lineno)
    return found


def _shown(path: Path) -> str:
    return str(path.relative_to(REPO_ROOT)) if path.is_relative_to(REPO_ROOT) else path.name


def _sources() -> list[Path]:
    files: list[Path] = []
    for root in SCANNED:
        files += [root] if root.is_file() else sorted(p for p in root.rglob("*") if p.suffix in (".py", ".smk"))
    return [p for p in files if "config/models.py" not in p.as_posix()]


def literal_defaults(files: list[Path] | None = None) -> list[str]:
    """file:line: text of every literal default written for a config key outside predict.config.models."""
    keys, names, hits = _config_keys(), _defaults_by_name(), []
    for path in files or _sources():
        lines = path.read_text().splitlines()
        marked = {n for n, line in enumerate(lines, 1) if NOT_CONFIG_MARK in line or MIRROR_MARK.search(line)}
        for number, line in enumerate(lines, 1):
            if number in marked:
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
        if path.suffix == ".py":
            repeats: dict[int, list[str]] = {}
            # `repeated`, not `keys`: rebinding the config keys here (to a marked repeat's "rl.lr") once made every
            # later file's form checks a substring test, and the scan missed `or "B"` in stats/extensions.py
            for number, repeated in _python_repeats(path, names):
                repeats.setdefault(number, []).append(repeated)
            hits += [f"{_shown(path)}:{number}: {lines[number - 1].strip()[:100]}  [{'; '.join(dict.fromkeys(found))}]"
                     for number, found in sorted(repeats.items()) if number not in marked]
    return hits


def test_no_literal_default_of_a_config_key_outside_the_models():
    hits = literal_defaults()
    assert not hits, ("defaults of config keys written outside src/predict/config/models.py (take the typed section "
                      "or a required argument; read the key from the config, where load_config filled it in):\n"
                      + "\n".join(hits))


def test_the_scan_sees_each_form(tmp_path):
    sample = tmp_path / "sample.py"
    sample.write_text(
        'a = env.get("test_cost", 1)\nb = cfg.get("target") or 0.8\nc = ev["reference"] or "sft"\n'   # 1-3
        'd = {"resamples": 10_000, **boot}\ne = config.get("evaluation") or {}\n'                     # 4-5
        'f = {"deltas": [0.1], "target": 0.8,\n     **power}\n'                                        # 6-7
        'BATCH_INVARIANT_DEFAULT = True\nDEFAULT_API_KEY_VAR = "X"\n'                                  # 8-9
        'class C:\n    eps_low: float = 0.2\n    eps_low_other: float = 0.2\n    kl_coef: float = 0.5\n'  # 10-13
        'def boot(\n    x,\n    resamples: int = 10_000,\n    ci: float = 0.95,\n    seed=1,\n):\n'  # 14-19
        '    pass\n'                                                                                 # 20
        'def power(*, significance=0.05, target: float = 0.9, reference="sft"): pass\n'              # 21
        '@dataclass\nclass T:\n    wandb_mode: str = "disabled"\n    wandb_project: str = "other"\n'  # 22-25
        'STARTUP_TIMEOUT_S = 300.0\nMAX_TOKENS = 256\n'                                                # 26-27
        'p.add_argument("--max-model-len", type=int, default=4096)\n'                                 # 28
        'p.add_argument("--port", type=int, default=4096)\n'                                          # 29
        'def iso(require="auto", accept_weaker=False, gold: bool = 1): pass\n'                       # 30
        'def marked(resamples=10_000): pass  # its own count, not a config default\n'                 # 31
        'def lists(gold_splits=("sft", "rl", "val"), extras=()): pass\n'                             # 32
        'g = spec.get("base_arm") or spec.get("arm") or "B"\n'                                       # 33
    )
    assert sorted(int(h.split(":")[1]) for h in literal_defaults([sample])) == [
        1, 2, 3, 4, 6, 8, 11, 16, 17, 21, 24, 26, 28, 30, 32, 33]


def test_a_marked_repeat_in_one_file_does_not_blind_the_scan_of_the_next(tmp_path):
    first, second = tmp_path / "a.py", tmp_path / "b.py"
    first.write_text("def marked(resamples=10_000): pass  # its own count, not a config default\n")
    second.write_text('b = cfg.get("target") or 0.8\n')
    assert literal_defaults([first, second]) == ['b.py:1: b = cfg.get("target") or 0.8']


def test_mirrored_defaults_equal_the_models():
    from predict.config import models

    mirrors = []
    for path in _sources():
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if (mark := MIRROR_MARK.search(line)) and (field := DATACLASS_FIELD.match(line)):
                model = getattr(models, mark["model"])
                mirrors.append((f"{_shown(path)}:{number}", ast.literal_eval(field["lit"]),
                                field_default(model.model_fields[mark["key"]])))
    assert len(mirrors) == 4  # env/protocol.py's ProtocolConfig
    assert [m for m in mirrors if m[1] != m[2]] == []


# A mirrored class field: `name: type = literal  # mirrors the config default (Model.key)`.
DATACLASS_FIELD = re.compile(r"^\s+(?P<key>[a-z_]+)\s*:\s*[^=()]+=\s*(?P<lit>" + LITERAL + r")\s*(?:#.*)?$")


# -- no hand cast of a config value (issues 40, 61): the models type every value, the stage's typed object reads it

CASTS = {"int", "float", "str", "bool"}
# Names that hold (a part of) the study's config: the sections' own names and what the code calls a config or a view.
CONFIG_RECEIVERS = {"config", "cfg", "study", "study_config", "settings", "view", "typed", "section"}


def _config_read(node: ast.expr, keys: set[str], receivers: set[str]) -> bool:
    """Whether `node` reads a config value: `config_default(...)`, or a config key of a config-holding name
    (``rl["lr"]``, ``model.get("base")``, ``view.model.base``, ``config.alpha``)."""
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "config_default":
        return True
    if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant) and node.slice.value in keys:
        holder = node.value
    elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get"
          and node.args and isinstance(node.args[0], ast.Constant) and node.args[0].value in keys):
        holder = node.func.value
    elif isinstance(node, ast.Attribute) and node.attr in keys:
        holder = node.value
    else:
        return False
    name = holder.id if isinstance(holder, ast.Name) else holder.attr if isinstance(holder, ast.Attribute) else None
    return name in receivers


def hand_casts(files: list[Path] | None = None) -> list[str]:
    """file:line: text of every int()/float()/str()/bool() of a config value outside predict.config."""
    keys = _config_keys()
    receivers = CONFIG_RECEIVERS | {name for model in _sections() for name, field in model.model_fields.items()
                                    if any(sections_in(field.annotation))}  # the sections' names: rl, model, data...
    hits = []
    for path in files or [p for p in _sources() if p.suffix == ".py" and "/predict/config/" not in p.as_posix()]:
        lines = path.read_text().splitlines()
        for node in ast.walk(ast.parse("\n".join(lines), filename=str(path))):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in CASTS
                    and len(node.args) == 1 and _config_read(node.args[0], keys, receivers)):
                hits.append(f"{_shown(path)}:{node.lineno}: {lines[node.lineno - 1].strip()[:110]}")
    return hits


def test_no_hand_cast_of_a_config_value():
    hits = hand_casts()
    assert not hits, ("casts of config values (read the stage's typed object, `predict.stages.stage_settings`; the "
                      "models give each value its type):\n" + "\n".join(hits))


def test_the_cast_scan_sees_each_form(tmp_path):
    sample = tmp_path / "sample.py"
    sample.write_text(
        'a = float(rl["lr"])\nb = int(rl["group_size"])\nc = str(model.get("base"))\n'           # 1-3
        'd = float(config_default(SharedServerSettings, "idle_s"))\ne = str(view.model.base)\n'  # 4-5
        'f = float(config.alpha)\ng = bool(config.mask_decision)\n'                               # 6-7
        'h = int(row["seed"])\ni = int(hf_config["hidden_size"])\nj = float(lr)\n'                # 8-10 data, not config
        'k = str(path)\nl = int(r.get("seed"))\n'                                                 # 11-12
    )
    assert sorted(int(h.split(":")[1]) for h in hand_casts([sample])) == [1, 2, 3, 4, 5, 6, 7]
