"""The ``json`` input kind: any JSON object a user's handler understands, optionally held to a JSON Schema."""

from __future__ import annotations

import json
from functools import cached_property
from typing import Any, Literal

from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError, best_match
from jsonschema.protocols import Validator
from jsonschema.validators import validator_for
from pydantic import BaseModel, ConfigDict, Field, field_validator
from referencing import Registry, Resource
from referencing.exceptions import Unresolvable
from referencing.jsonschema import DRAFT202012, specification_with

from inferq.shared.errors import ConfigError, InvalidInput
from inferq.shared.inputs.base import InputKind, Payload, json_type
from inferq.shared.inputs.schema_example import schema_example
from inferq.shared.settings import Settings

_MAX_MESSAGE_CHARS = 300


class JsonInput(BaseModel):
    """A JSON object, checked against ``schema`` when the config gives one."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    kind: Literal["json"] = "json"
    # "schema" in config.json; its "$schema" picks the draft, 2020-12 when absent. Named apart from
    # BaseModel's deprecated schema() method, which a field called "schema" would shadow.
    json_schema: dict[str, Any] | None = Field(default=None, alias="schema")

    @field_validator("json_schema")
    @classmethod
    def _usable(cls, schema: dict[str, Any] | None) -> dict[str, Any] | None:
        if schema is not None:
            _check_schema(schema)
        return schema

    @cached_property
    def validator(self) -> Validator | None:
        """The schema's validator, built once per config (it caches resolved references)."""
        if self.json_schema is None:
            return None
        return validator_for(self.json_schema, default=Draft202012Validator)(self.json_schema)


def _check_schema(schema: dict[str, Any]) -> None:
    """Refuse, at config load, a schema that is not valid JSON Schema or has a $ref nothing resolves."""
    cls = validator_for(schema, default=Draft202012Validator)
    try:
        cls.check_schema(schema)
    except SchemaError as exc:
        where = exc.json_path.removeprefix("$").lstrip(".") or "the top level"
        raise ValueError(f"not a valid JSON Schema: {exc.message[:_MAX_MESSAGE_CHARS]} (at {where})") from None
    # Nothing is fetched at run time, so every $ref must point inside the schema itself.
    resource = specification_with(schema.get("$schema", ""), default=DRAFT202012).create_resource(schema)
    registry: Registry[Any] = Registry().with_resource(resource.id() or "", resource).crawl()
    try:
        _resolve_refs(resource, registry.resolver(resource.id() or ""))
    except Unresolvable as exc:
        raise ValueError(f"the JSON Schema has a $ref that does not resolve within it: {exc}") from None


def _resolve_refs(resource: Resource[Any], resolver: Any) -> None:
    contents = resource.contents
    if isinstance(contents, dict) and isinstance(contents.get("$ref"), str):
        resolver.lookup(contents["$ref"])
    for sub in resource.subresources():
        _resolve_refs(sub, resolver.in_subresource(sub))


def _path(parts: Any) -> str:
    return "inputs" + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in parts)


def from_json(spec: JsonInput, inputs: Any, model: str, settings: Settings) -> Payload:
    """The object re-serialized compactly, once it is an object the model's schema accepts."""
    if not isinstance(inputs, dict):
        raise InvalidInput(f"inputs must be a JSON object, got {json_type(inputs)}")
    if spec.validator is not None:
        try:
            error = best_match(spec.validator.iter_errors(inputs))
        except Unresolvable as exc:  # config load resolves every $ref, so this is a bug, not bad input
            raise ConfigError(f"model {model}'s JSON Schema: {exc}") from None
        except RecursionError:
            raise InvalidInput("inputs is nested too deeply to check") from None
        if error is not None:
            raise InvalidInput(f"{_path(error.absolute_path)}: {error.message[:_MAX_MESSAGE_CHARS]}")
    try:
        data = json.dumps(inputs, separators=(",", ":"), allow_nan=False).encode()
    except ValueError:
        # json.loads reads 1e400 as infinity although it refuses the Infinity literal.
        raise InvalidInput("inputs holds a number too large for JSON") from None
    except RecursionError:
        raise InvalidInput("inputs is nested too deeply") from None
    return Payload(data, "application/json")


def example(spec: JsonInput) -> dict[str, Any] | None:
    """An object the model's schema accepts (``{}`` without one), or None when none can be built for it."""
    if spec.json_schema is None:
        return {}
    value = schema_example(spec.json_schema)
    if not isinstance(value, dict) or spec.validator is None or not spec.validator.is_valid(value):
        return None
    return value


def openapi(spec: JsonInput) -> dict[str, dict[str, Any]]:
    return {"application/json": {**(spec.json_schema or {}), "type": "object"}}


KIND = InputKind(
    name="json",
    config=JsonInput,
    takes="a JSON body {'inputs': {...}} holding a JSON object",
    openapi=openapi,
    from_json=from_json,
    example=example,
)
