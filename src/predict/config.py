"""Load a study config and validate it against config/schema.yaml, failing with one clear message.

The Snakefile and every `predict` stage go through `load_config`/`validate_config`, so a typo such as
`data.sizes.stf` is caught before any job starts, with the file and the key path in the message.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import jsonschema
import yaml

REPO_ROOT = Path(__file__).resolve().parents[2]
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


def load_config(path: str | Path) -> dict[str, Any]:
    """Read a YAML config and validate it; the result is a plain dict."""
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
    return config


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
    """A config passed inline as JSON (how Snakemake hands its merged config to a stage), validated."""
    return _json_config(text, "--config-json")


def load_config_slice(path: str | Path) -> dict[str, Any]:
    """A stage's slice of a validated config (predict.stages.slice_file), checked again key by key."""
    try:
        text = Path(path).read_text()
    except FileNotFoundError:
        raise ConfigError(f"{path}: config slice not found") from None
    return _json_config(text, str(path), partial=True)
