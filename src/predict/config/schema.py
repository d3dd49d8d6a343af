"""config/schema.yaml, generated from the config models (predict.config.models): `predict config-schema` writes it,
`predict config-schema --check` says whether it is current, and tests/test_config_defaults.py holds it equal.

The file is for readers and for tools that speak JSON Schema (Snakemake's `validate`, an editor): `predict` itself
validates against the models. It is pydantic's JSON schema of `StudyConfig`, made readable: every section inlined
where it is used (no `$ref`), no generated titles, a nullable value as `type: [X, "null"]` (a nullable section as
`anyOf: [null, the section]`), and every default as the config gets it filled in (a section's default is the
section filled with its own defaults).
"""

from __future__ import annotations

import sys
from typing import Any

import yaml

from predict.config import SCHEMA_PATH, field_default, has_default, sections_in
from predict.config.models import Section, StudyConfig

HEADER = """\
# GENERATED from src/predict/config/models.py by `predict config-schema`: do not edit here. Edit the models (each
# key's type, bounds, allowed values, default and description) and run the command again; a test holds the two equal.
"""
# The order keys are written in, for readers: what a value is, then what it holds.
ORDER = ("$schema", "title", "default", "type", "const", "enum", "pattern", "minimum", "exclusiveMinimum", "maximum",
         "exclusiveMaximum", "minItems", "uniqueItems", "minProperties", "items", "anyOf", "description",
         "additionalProperties", "patternProperties", "required", "properties")


def _models() -> dict[str, type[Section]]:
    """Every section model by name (pydantic's $defs names)."""
    found: dict[str, type[Section]] = {}

    def walk(model: type[Section]) -> None:
        found[model.__name__] = model
        for field in model.model_fields.values():
            for sub in sections_in(field.annotation):
                if sub is not None and sub.__name__ not in found:
                    walk(sub)

    walk(StudyConfig)
    return found


def _ordered(node: dict[str, Any]) -> dict[str, Any]:
    rank = {key: i for i, key in enumerate(ORDER)}
    return dict(sorted(node.items(), key=lambda kv: rank.get(kv[0], len(ORDER))))


def _text(description: str) -> str:
    """A docstring's lines as one paragraph (YAML folds it again at the file's width)."""
    return " ".join(description.split())


class _Builder:
    def __init__(self) -> None:
        self.full = StudyConfig.model_json_schema(mode="validation")
        self.defs = self.full.pop("$defs", {})
        self.models = _models()

    def model(self, model: type[Section], schema: dict[str, Any]) -> dict[str, Any]:
        """A section's object schema, its properties' defaults as `predict.config` fills them in."""
        out = {k: self.value(v) for k, v in schema.items() if k not in ("properties", "title")}
        if "description" in out:
            out["description"] = _text(out["description"])
        properties = {}
        for name, field in model.model_fields.items():
            prop = self.value(schema["properties"][name])
            prop.pop("default", None)
            if has_default(field):
                prop["default"] = field_default(field)
            properties[name] = _ordered(prop)
        out["properties"] = properties
        return _ordered(out)

    def value(self, node: Any) -> Any:
        """A schema node with every `$ref` inlined, titles dropped and `anyOf [X, null]` as a nullable X."""
        if isinstance(node, list):
            return [self.value(v) for v in node]
        if not isinstance(node, dict):
            return node
        if "$ref" in node:
            name = node["$ref"].rsplit("/", 1)[-1]
            inlined = self.model(self.models[name], self.defs[name])
            return self.value({**inlined, **{k: v for k, v in node.items() if k != "$ref"}})
        out = {k: (self.value(v) if k not in ("properties", "default", "const", "enum") else v)
               for k, v in node.items() if k != "title"}
        if "description" in out:
            out["description"] = _text(out["description"])
        branches = out.get("anyOf", [])
        if {"type": "null"} in branches and len(branches) == 2:
            (other,) = [b for b in branches if b != {"type": "null"}]
            del out["anyOf"]
            if "enum" in other:
                out = {**other, **out, "enum": [*other["enum"], None]}
            elif isinstance(other.get("type"), str) and "properties" not in other:
                out = {**other, **out, "type": [other["type"], "null"]}
            else:
                # a section or null: null first, so that a validator filling defaults (Snakemake's `validate`)
                # stops at it and never fills a null section's keys
                out["anyOf"] = [{"type": "null"}, other]
        if "patternProperties" in out:
            out.setdefault("additionalProperties", False)  # a key matching no pattern is refused
        return _ordered(out)


def schema() -> dict[str, Any]:
    """The JSON schema of a study config file (Draft 2020-12), from the models."""
    builder = _Builder()
    top = builder.model(StudyConfig, builder.full)
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", "title": StudyConfig.model_config["title"],
            **{k: v for k, v in top.items() if k != "title"}}


def _one_line(data: Any) -> bool:
    """Whether a value reads well as one flow line (`{type: integer, minimum: 1}`, `[sft, rl, val]`)."""
    flat = yaml.safe_dump(data, default_flow_style=True, width=10**6, sort_keys=False).strip()
    return len(flat) <= 80 and not (isinstance(data, dict) and "properties" in data)


class _Dumper(yaml.SafeDumper):
    """Block style for sections and long values, one flow line for a short leaf or list."""

    def represent_dict(self, data: dict) -> yaml.MappingNode:
        return self.represent_mapping("tag:yaml.org,2002:map", data.items(), flow_style=_one_line(data))

    def represent_list(self, data: list) -> yaml.SequenceNode:
        return self.represent_sequence("tag:yaml.org,2002:seq", data, flow_style=_one_line(data))


_Dumper.add_representer(dict, _Dumper.represent_dict)
_Dumper.add_representer(list, _Dumper.represent_list)


def schema_text() -> str:
    """config/schema.yaml's text."""
    return HEADER + yaml.dump(schema(), Dumper=_Dumper, sort_keys=False, width=100, allow_unicode=True)


def write_schema(check: bool = False) -> int:
    """`predict config-schema`: write config/schema.yaml from the models; with `check`, only say whether it is
    current (exit status 1 when not)."""
    text = schema_text()
    current = SCHEMA_PATH.read_text() if SCHEMA_PATH.exists() else ""
    if check:
        if current != text:
            print(f"{SCHEMA_PATH} is not generated from the current config models: run `predict config-schema`",
                  file=sys.stderr)
        return int(current != text)
    if current != text:
        SCHEMA_PATH.write_text(text)
    print(f"{SCHEMA_PATH}: {'written' if current != text else 'already current'}")
    return 0
