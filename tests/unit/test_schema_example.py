"""The example "inputs" a json model's schema gets on the status page (shared/inputs/schema_example.py): an object its
schema accepts, plain and the same every time; none where only a person could write one."""

from __future__ import annotations

from typing import Any

import pytest
from jsonschema import Draft202012Validator

from inferq.shared.inputs import JsonInput, TensorInput, input_example
from inferq.shared.inputs.image import ImageInput
from inferq.shared.inputs.schema_example import schema_example
from inferq.shared.inputs.text import TextInput

POINT = {"type": "object", "properties": {"x": {"type": "number"}, "y": {"type": "number"}}, "required": ["x", "y"]}
# (schema, the example it gets)
CASES: list[tuple[dict[str, Any], Any]] = [
    (POINT, {"x": 0.0, "y": 0.0}),
    ({"type": "object", "properties": {"n": {"type": "integer", "minimum": 3, "maximum": 9}}}, {"n": 3}),
    ({"type": "object", "properties": {"n": {"type": "integer", "exclusiveMaximum": -4}}}, {"n": -5}),
    ({"type": "object", "properties": {"p": {"type": "number", "exclusiveMinimum": 0, "maximum": 1}}}, {"p": 0.1}),
    ({"type": "object", "properties": {"n": {"type": "integer", "minimum": 5, "multipleOf": 4}}}, {"n": 8}),
    ({"type": "object", "properties": {"lang": {"enum": ["de", "en"]}, "k": {"const": 3}}}, {"lang": "de", "k": 3}),
    ({"type": "object", "properties": {"top": {"type": "integer", "default": 5, "minimum": 1}}}, {"top": 5}),
    (
        {"type": "object", "examples": [{"text": "Der Hund"}], "properties": {"text": {"type": "string"}}},
        {"text": "Der Hund"},
    ),
    (
        {
            "type": "object",
            "properties": {"points": {"type": "array", "items": {"$ref": "#/$defs/point"}, "minItems": 2}},
            "$defs": {"point": POINT},
        },
        {"points": [{"x": 0.0, "y": 0.0}, {"x": 0.0, "y": 0.0}]},
    ),  # fmt: skip
    (
        {
            "type": "object",
            "properties": {
                "pair": {"type": "array", "prefixItems": [{"type": "string"}, {"type": "boolean"}], "items": False}
            },
        },
        {"pair": ["text", True]},
    ),  # fmt: skip
    (
        {"type": "object", "properties": {"name": {"type": "string", "minLength": 6, "maxLength": 8}}},
        {"name": "textte"},
    ),
    ({"type": "object", "properties": {"v": {"type": ["null", "integer"]}}}, {"v": 0}),
    ({"allOf": [POINT, {"properties": {"z": {"type": "boolean"}}}]}, {"x": 0.0, "y": 0.0, "z": True}),
    ({"type": "object", "properties": {"id": {"oneOf": [{"type": "integer"}, {"type": "string"}]}}}, {"id": 0}),
    ({"type": "object", "required": ["anything"]}, {"anything": {}}),
]


@pytest.mark.parametrize(("schema", "expected"), CASES)
def test_a_schema_gets_an_example_it_accepts(schema: dict[str, Any], expected: Any) -> None:
    assert schema_example(schema) == expected
    assert Draft202012Validator(schema).is_valid(expected)
    assert input_example(JsonInput.model_validate({"schema": schema})) == expected


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "object", "properties": {"zip": {"type": "string", "pattern": "^[0-9]{5}$"}}},
        {"type": "object", "properties": {"when": {"type": "string", "format": "date"}}},
        {"type": "object", "properties": {"n": {"type": "integer"}}, "not": {"required": ["n"]}},
        {"type": "object", "properties": {"tree": {"$ref": "#"}}},  # recursive past any depth
    ],
)
def test_a_schema_only_a_person_can_satisfy_gets_no_example(schema: dict[str, Any]) -> None:
    assert input_example(JsonInput.model_validate({"schema": schema})) is None


def test_each_kind_suggests_what_it_takes() -> None:
    assert input_example(JsonInput()) == {}  # any object
    assert input_example(TensorInput(shape=[2])) == [0.0, 0.0]
    assert input_example(TensorInput(shape=[2, 3], dtype="int64")) == [[0, 0, 0], [0, 0, 0]]
    assert input_example(TensorInput(shape=[3, 224, 224])) is None  # 150,528 zeros are no hint
    assert input_example(ImageInput()) is None and input_example(TextInput()) is None
