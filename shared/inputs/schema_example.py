"""An example instance of a JSON Schema, for a hint a person reads (the status page's playground): built from the
schema's own ``examples``, ``default``, ``const`` or ``enum`` where it gives them, else the simplest value of each
type within its bounds, every listed property filled in. It is checked against the schema by its caller; a schema it
cannot satisfy (a ``pattern``, a ``not``) gets no example rather than a wrong one.

Written here rather than taken from a generator (hypothesis-jsonschema, jsf): those draw random values, a different
and noisier one at every call, where a hint wants the same plain one each time.
"""

from __future__ import annotations

import math
from typing import Any

# Past this depth a (recursive) schema gets no example: a hint, not a proof.
MAX_DEPTH = 8
_NO_EXAMPLE = object()


def schema_example(schema: Any) -> Any:
    """An instance of ``schema`` (its local ``$ref``s followed), or None when it has none to offer."""
    value = _example(schema, schema, 0)
    return None if value is _NO_EXAMPLE else value


def _example(schema: Any, root: Any, depth: int) -> Any:
    if schema is True or schema == {}:
        return {}
    if not isinstance(schema, dict) or depth > MAX_DEPTH:
        return _NO_EXAMPLE
    if isinstance(schema.get("examples"), list) and schema["examples"]:
        return schema["examples"][0]
    for given in ("const", "default"):
        if given in schema:
            return schema[given]
    if isinstance(schema.get("enum"), list) and schema["enum"]:
        return schema["enum"][0]
    ref = schema.get("$ref")
    if isinstance(ref, str):
        return _example(_local(ref, root), root, depth + 1)
    for choice in ("oneOf", "anyOf"):
        if isinstance(schema.get(choice), list) and schema[choice]:
            return _example({**_rest(schema, choice), **schema[choice][0]}, root, depth + 1)
    if isinstance(schema.get("allOf"), list):
        parts = [_example(part, root, depth + 1) for part in schema["allOf"]]
        own = _example(_rest(schema, "allOf"), root, depth + 1) if len(schema) > 1 else {}
        if all(isinstance(part, dict) for part in (*parts, own)):
            return {key: value for part in (*parts, own) for key, value in part.items()}
        return _NO_EXAMPLE
    return _typed(schema, root, depth)


def _typed(schema: dict[str, Any], root: Any, depth: int) -> Any:
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "null")
    if kind is None:
        kind = "object" if "properties" in schema else "array" if "items" in schema else None
    if kind == "object":
        properties = schema.get("properties") or {}
        names = list(properties) + [n for n in schema.get("required", []) if n not in properties]
        out = {}
        for name in names:
            value = _example(properties.get(name, {}), root, depth + 1)
            if value is _NO_EXAMPLE:
                return _NO_EXAMPLE
            out[name] = value
        return out
    if kind == "array":
        prefix = [_example(item, root, depth + 1) for item in schema.get("prefixItems", [])]
        count = max(int(schema.get("minItems", 1)), len(prefix))
        rest = [_example(schema.get("items", {}), root, depth + 1)] * (count - len(prefix))
        items = prefix + rest
        return _NO_EXAMPLE if any(item is _NO_EXAMPLE for item in items) else items
    if kind == "string":
        if "pattern" in schema or "format" in schema:
            return _NO_EXAMPLE  # a string that fits only a person can write
        text = "text" * (1 + int(schema.get("minLength", 0)) // 4)
        return text[: max(int(schema.get("minLength", 0)), min(4, int(schema.get("maxLength", 4))))]
    if kind in ("integer", "number"):
        return _number(schema, kind == "integer")
    if kind == "boolean":
        return True
    if kind == "null":
        return None
    return _NO_EXAMPLE


def _number(schema: dict[str, Any], integer: bool) -> int | float:
    """0 where the bounds allow it, else the bound nearest to 0 (past an exclusive one by 1, or by a tenth)."""
    step = 1 if integer else 0.1
    low = schema.get("minimum", -math.inf)
    if "exclusiveMinimum" in schema:
        low = max(low, schema["exclusiveMinimum"] + step)
    high = schema.get("maximum", math.inf)
    if "exclusiveMaximum" in schema:
        high = min(high, schema["exclusiveMaximum"] - step)
    value = min(max(0, low), high)
    multiple = schema.get("multipleOf")
    if multiple:
        value = math.ceil(value / multiple) * multiple
    return math.ceil(value) if integer else float(value)


def _rest(schema: dict[str, Any], keyword: str) -> dict[str, Any]:
    return {key: value for key, value in schema.items() if key != keyword}


def _local(ref: str, root: Any) -> Any:
    """The part of ``root`` a local reference (``#/$defs/x``) points at; None for any other."""
    if not ref.startswith("#"):
        return None
    node = root
    for part in ref[1:].split("/")[1:] if ref != "#" else []:
        part = part.replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isascii() and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return None
    return node
