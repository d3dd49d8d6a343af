"""Load a study config, validate it against the config models (one pass, one clear message), and fill in its
defaults.

The models (predict.config.models) are the schema: every key's type, bounds, allowed values, default and
description; config/schema.yaml is generated from them (`predict config-schema`, predict.config.schema). The
Snakefile and every `predict` stage go through `load_config`/`config_from_json` (the Snakefile: `with_defaults`),
so a typo such as `data.sizes.stf` is caught before any job starts, with the file and the key path in the message,
and every key with a default is there when a stage slices the config.
"""

from __future__ import annotations

import copy
import json
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pydantic
import yaml

from predict.config.models import NO_DEFAULT, Section, StudyConfig

REPO_ROOT = Path(__file__).resolve().parents[3]
SCHEMA_PATH = REPO_ROOT / "config" / "schema.yaml"


class ConfigError(ValueError):
    """A config file is missing, unreadable, or breaks the config models."""


def _model_at(root: type[Section], path: list[str]) -> type[Section] | None:
    """The section model at a key path below `root` (`["arms", "B"]` of StudyConfig: ArmSettings), if there is one."""
    model: type[Section] | None = root
    entries: type[Section] | None = None
    for key in path:
        if entries is not None:  # a mapping's entry (an arm, an ablation), whatever its name
            model, entries = entries, None
        elif model is None or key not in model.model_fields:
            return None
        else:
            model, entries = sections_in(model.model_fields[key].annotation)
    return model if entries is None else None


# pydantic error types that say "not this type" (a union reports one per branch it tried).
_MISMATCH = {"literal_error", "model_type", "model_attributes_type", "dict_type", "list_type", "string_type",
             "int_type", "float_type", "bool_type", "none_required"}
_NOTHING = object()


@dataclass
class _Problem:
    path: tuple[str, ...]
    text: str
    got: Any = _NOTHING
    union: tuple[str, ...] | None = None
    """The path of the union whose branch this problem is, if it is one (pydantic tags each branch's errors)."""
    mismatch: bool = False

    def message(self) -> str:
        where = ".".join(self.path) or "<top level>"
        return f"{where}: {self.text}" + ("" if self.got is _NOTHING else f", got {self.got!r}")


def _problem(error: Any, data: Any, root: type[Section]) -> _Problem:
    """One pydantic error as a problem at a key path of `data`: the location's parts that are keys (or list
    indexes) of the data make the path; any other part is a union branch's tag (`literal['study','balanced']`,
    `TraceMix`) or a dict key's marker (`[key]`)."""
    path: list[str] = []
    node, union = data, None
    loc = list(error["loc"])
    last = loc.pop() if error["type"] in ("extra_forbidden", "missing") or loc[-1:] == ["[key]"] else None
    if last == "[key]":
        last = loc.pop()
    for part in loc:
        if isinstance(node, Mapping) and part in node:
            path.append(str(part))
            node = node[part]
        elif isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node):
            path.append(str(part))
            node = node[part]
        elif union is None:
            union = tuple(path)
    message = str(error["msg"]).removeprefix("Value error, ")
    if error["type"] == "extra_forbidden":
        model = _model_at(root, path)
        keys = f" (its keys: {', '.join(model.model_fields)})" if model is not None else ""
        text = f"unknown key {last!r}{keys}"
    elif error["type"] == "missing":
        text = f"the required key {last!r} is missing"
    elif last is not None:
        text = f"the key {last!r}: {message}"
    else:
        return _Problem(tuple(path), message, node, union, error["type"] in _MISMATCH)
    return _Problem(tuple(path), text, union=union)


def _problems(error: pydantic.ValidationError, data: Any, root: type[Section] = StudyConfig,
              partial: bool = False) -> list[str]:
    """A message for each problem pydantic found in `data` (validated as `root`), shallowest first. Of a union's
    branches, the ones that failed inside the value (it had that branch's type) are kept, else those that are not
    "not this type", else the "not this type" ones joined into one message. partial: missing keys are no problem."""
    found = [_problem(e, data, root) for e in error.errors(include_url=False)
             if not (partial and e["type"] == "missing")]
    plain = [p for p in found if p.union is None]
    unions: dict[tuple[str, ...], list[_Problem]] = {}
    for p in found:
        if p.union is not None:
            unions.setdefault(p.union, []).append(p)
    for where, branches in unions.items():
        inside = [p for p in branches if len(p.path) > len(where)] or [p for p in branches if not p.mismatch]
        if inside:
            plain += inside
        else:
            texts = list(dict.fromkeys(p.text for p in branches))
            plain.append(_Problem(where, ", or ".join(texts), branches[0].got))
    return [p.message() for p in sorted(plain, key=lambda p: (len(p.path), p.path))]


def config_problems(error: pydantic.ValidationError, data: Any, root: type[Section]) -> list[str]:
    """`_problems` for a model of part of the config (a stage's): a message per problem, the shallowest first."""
    return _problems(error, data, root)


def validate_config(config: Mapping[str, Any], source: str = "config", partial: bool = False) -> None:
    """Raise ConfigError naming the source file and the first offending key (the shallowest, for stability).
    partial: a slice of a config (predict.stages), whose keys are checked but none is required."""
    if not isinstance(config, Mapping):
        raise ConfigError(f"{source}: expected a mapping at the top level, got {type(config).__name__}")
    try:
        StudyConfig.model_validate(dict(config), strict=True)
    except pydantic.ValidationError as e:
        problems = _problems(e, dict(config), partial=partial)
        if problems:
            more = f" (and {len(problems) - 1} more problem(s))" if len(problems) > 1 else ""
            raise ConfigError(f"{source}: {problems[0]}{more}") from None


def has_default(field: pydantic.fields.FieldInfo) -> bool:
    """Whether a model field is a config default (not required, not marked NO_DEFAULT)."""
    return not field.is_required() and field.json_schema_extra is not NO_DEFAULT


def field_default(field: pydantic.fields.FieldInfo) -> Any:
    """A field's default as plain data: a section filled in with its own defaults."""
    value = field.get_default(call_default_factory=True)
    return _fill(type(value), {}) if isinstance(value, Section) else copy.deepcopy(value)


def config_default(model: type[Section], key: str) -> Any:
    """The default of one key of a section (where a whole optional section is left out, e.g. rl.mask_decision)."""
    field = model.model_fields[key]
    if not has_default(field):
        raise KeyError(f"{model.__name__}.{key} has no default")
    return field_default(field)


def allowed_values(model: type[Section], key: str) -> tuple[Any, ...]:
    """The values a key of a section may take, from its field's Literal (the one place they are written), e.g.
    allowed_values(RLSettings, "weight_sync") == ("auto", "memory", "folder"); a union's literal members only."""

    def literals(annotation: Any) -> list[Any]:
        if typing.get_origin(annotation) is typing.Literal:
            return list(typing.get_args(annotation))
        return [v for member in typing.get_args(annotation) for v in literals(member)]

    values = tuple(dict.fromkeys(literals(model.model_fields[key].annotation)))
    if not values:
        raise KeyError(f"{model.__name__}.{key} has no allowed values (no Literal in its type)")
    return values


def sections_in(annotation: Any) -> tuple[type[Section] | None, type[Section] | None]:
    """(the Section a value of this type may be, the Section a dict value's entries are) for a field's annotation."""
    while typing.get_origin(annotation) is typing.Annotated:
        annotation = typing.get_args(annotation)[0]
    if isinstance(annotation, type) and issubclass(annotation, Section):
        return annotation, None
    if typing.get_origin(annotation) is dict:
        return None, sections_in(typing.get_args(annotation)[1])[0]
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        for member in typing.get_args(annotation):
            section, entries = sections_in(member)
            if section or entries:
                return section, entries
    return None, None


def _fill(model: type[Section], data: Mapping[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(dict(data))
    for name, field in model.model_fields.items():
        if name not in out:
            if has_default(field):
                out[name] = field_default(field)
            continue
        section, entries = sections_in(field.annotation)
        if section and isinstance(out[name], Mapping):
            out[name] = _fill(section, out[name])
        elif entries and isinstance(out[name], Mapping):
            out[name] = {k: _fill(entries, v) if isinstance(v, Mapping) else v for k, v in out[name].items()}
    return out


def fill_section(model: type[Section], data: Mapping[str, Any]) -> dict[str, Any]:
    """One section (a plain dict) with the defaults of `model` filled in, as `with_defaults` fills a whole config:
    for callers that build a section by hand (tests, a one-off server) rather than load a config."""
    return _fill(model, data)


def with_defaults(config: Mapping[str, Any], source: str = "config") -> dict[str, Any]:
    """A config with every default (predict.config.models) filled in and validated, as plain dicts: a default fills
    a key missing from a section the config has, or a section the models give a default_factory; a section without
    one (`rft`, `model.tiny`...) that the config leaves out stays out, and an explicit null stays null. Raises
    ConfigError naming `source` and the key (`validate_config`: the one validation pass)."""
    filled = _fill(StudyConfig, config)
    validate_config(filled, source)
    return filled


def section(config: Mapping[str, Any], model: type[Section], *path: str) -> Any:
    """The typed section at `path` of a (slice of a) config with defaults, e.g. section(slice, SFTSettings, "sft");
    a section the config leaves out reads as its defaults (a required key then fails, naming the path)."""
    node: Any = config
    for key in path:
        node = node[key] if isinstance(node, Mapping) and key in node else {}
    try:
        return model.model_validate(dict(node))
    except pydantic.ValidationError as e:
        where, message = _problems(e, dict(node), model)[0].split(": ", 1)
        key = ".".join([*path, *([] if where == "<top level>" else [where])])
        raise ConfigError(f"{key}: {message}") from None


def load_config(path: str | Path) -> dict[str, Any]:
    """Read a YAML config, validate it and fill in its defaults; the result is a plain dict."""
    path = Path(path)
    try:
        with open(path) as f:
            config = yaml.safe_load(f)
    except FileNotFoundError:
        raise ConfigError(f"{path}: config file not found") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: not valid YAML: {e}") from None
    if not isinstance(config, dict):
        raise ConfigError(f"{path}: expected a mapping at the top level, got {type(config).__name__}")
    return with_defaults(config, source=str(path))


def _json_config(text: str, source: str) -> dict[str, Any]:
    """A JSON object (a config or a slice of one), or a ConfigError naming its source."""
    try:
        config = json.loads(text)
    except json.JSONDecodeError as e:
        raise ConfigError(f"{source}: not valid JSON: {e}") from None
    if not isinstance(config, dict):
        raise ConfigError(f"{source}: expected an object at the top level")
    return config


def merge_config_files(*paths: Path) -> dict[str, Any]:
    """The YAML files merged in turn, nested mappings key by key (Snakemake's `update_config`): what a profile's
    configfile list, or `--configfile A B`, makes."""

    def update(base: dict[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
        for key, value in over.items():
            nested = isinstance(value, Mapping) and isinstance(base.get(key), Mapping)
            base[key] = update(dict(base.get(key) or {}), value) if nested else value
        return base

    merged: dict[str, Any] = {}
    for path in paths:
        update(merged, yaml.safe_load(Path(path).read_text()) or {})
    return merged


def config_from_json(text: str) -> dict[str, Any]:
    """A config passed inline as JSON (how Snakemake hands its merged config to a stage), validated, defaults in."""
    return with_defaults(_json_config(text, "--config-json"), source="--config-json")


def load_config_slice(path: str | Path) -> dict[str, Any]:
    """A stage's slice of a validated config (predict.stages.slice_file), checked again key by key, its defaults
    filled in like a whole config's (a no-op for the slices the workflow writes; a slice written by hand gets them
    too, so a stage reads every key it lists the same way however its config came)."""
    try:
        text = Path(path).read_text()
    except FileNotFoundError:
        raise ConfigError(f"{path}: config slice not found") from None
    filled = _fill(StudyConfig, _json_config(text, str(path)))
    validate_config(filled, source=str(path), partial=True)
    return filled
