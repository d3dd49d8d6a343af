"""Load a study config, validate it against config/schema.yaml (one clear message), and fill in its defaults.

The Snakefile and every `predict` stage go through `load_config`/`config_from_json` (the Snakefile: `with_defaults`),
so a typo such as `data.sizes.stf` is caught before any job starts, with the file and the key path in the message,
and every key with a default (predict.config.models, the one place defaults are written) is there when a stage
slices the config.
"""

from __future__ import annotations

import copy
import json
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import jsonschema
import pydantic
import yaml

from predict.config.models import NO_DEFAULT, Section, StudyConfig

REPO_ROOT = Path(__file__).resolve().parents[3]
SCHEMA_PATH = REPO_ROOT / "config" / "schema.yaml"


class ConfigError(ValueError):
    """A config file is missing, unreadable, or breaks the schema."""


def _key_path(error: jsonschema.ValidationError) -> str:
    return ".".join(str(p) for p in error.absolute_path) or "<top level>"


def _without_required(schema: Any) -> Any:
    """The schema with every `required` dropped: a stage's slice holds only some keys, each still checked."""
    if isinstance(schema, dict):
        return {k: _without_required(v) for k, v in schema.items() if k != "required"}
    return [_without_required(v) for v in schema] if isinstance(schema, list) else schema


def validate_config(config: Mapping[str, Any], source: str = "config", partial: bool = False) -> None:
    """Raise ConfigError naming the source file and the first offending key (the shallowest, for stability).
    partial: a slice of a config (predict.stages), whose keys are checked but none is required."""
    with open(SCHEMA_PATH) as f:
        schema = yaml.safe_load(f)
    validator = jsonschema.Draft202012Validator(_without_required(schema) if partial else schema)
    errors = sorted(validator.iter_errors(dict(config)), key=lambda e: (len(e.absolute_path), _key_path(e)))
    if errors:
        more = f" (and {len(errors) - 1} more problem(s))" if len(errors) > 1 else ""
        # "Additional properties are not allowed ('stf' was unexpected)" names the bad key itself;
        # for every other error the key path says where the bad value sits.
        raise ConfigError(f"{source}: {_key_path(errors[0])}: {errors[0].message}{more}")


def has_default(field: pydantic.fields.FieldInfo) -> bool:
    """Whether a model field is a config default (not required, not marked NO_DEFAULT)."""
    return not field.is_required() and field.json_schema_extra != NO_DEFAULT


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
    """A validated config with every default (predict.config.models) filled in, as plain dicts: a default fills a
    key missing from a section the config has, or a section the models give a default_factory; a section without
    one (`rft`, `model.tiny`...) that the config leaves out stays out, and an explicit null stays null. Raises
    ConfigError naming `source` where the models refuse what the schema passed (the two disagree: a bug here)."""
    filled = _fill(StudyConfig, config)
    try:
        StudyConfig.model_validate(filled)
    except pydantic.ValidationError as e:
        raise ConfigError(f"{source}: the config models (src/predict/config/models.py) refuse it: {e}") from None
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
        first = e.errors()[0]
        key = ".".join([*path, *map(str, first["loc"])])
        raise ConfigError(f"{key}: {first['msg']} (got {first.get('input')!r})") from None


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
    validate_config(config, source=str(path))
    return with_defaults(config, source=str(path))


def _json_config(text: str, source: str, partial: bool = False) -> dict[str, Any]:
    """A JSON object (a config or a slice of one), validated, or a ConfigError naming its source."""
    try:
        config = json.loads(text)
    except json.JSONDecodeError as e:
        raise ConfigError(f"{source}: not valid JSON: {e}") from None
    if not isinstance(config, dict):
        raise ConfigError(f"{source}: expected an object at the top level")
    validate_config(config, source=source, partial=partial)
    return config


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
    return _fill(StudyConfig, _json_config(text, str(path), partial=True))
