"""Input kinds, one module each: its config, its checks (run in the API, without torch), its OpenAPI.

Adding a kind is one module here with a ``KIND``, listed in ``KINDS`` and in ``Input``; the worker's
handlers read the Payload it stores.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import Field

from shared.inputs import document, image, tensor, text
from shared.inputs.base import InputKind, Payload
from shared.inputs.document import JsonInput
from shared.inputs.image import ImageInput
from shared.inputs.tensor import TensorInput
from shared.inputs.text import TextInput

__all__ = [
    "KINDS",
    "ImageInput",
    "Input",
    "InputKind",
    "JsonInput",
    "Payload",
    "TensorInput",
    "TextInput",
    "input_kind",
    "request_body",
]

KINDS: dict[str, InputKind[Any]] = {kind.name: kind for kind in (image.KIND, tensor.KIND, text.KIND, document.KIND)}
# ModelConfig.input: the config's "kind" picks the class.
Input = Annotated[ImageInput | TensorInput | TextInput | JsonInput, Field(discriminator="kind")]


def input_kind(spec: ImageInput | TensorInput | TextInput | JsonInput) -> InputKind[Any]:
    """The kind a model's input config belongs to."""
    return KINDS[spec.kind]


def request_body(kinds: list[InputKind[Any]] | None = None) -> dict[str, Any]:
    """The OpenAPI requestBody taking what any of ``kinds`` (all by default) takes."""
    content: dict[str, dict[str, Any]] = {}
    for kind in kinds if kinds is not None else list(KINDS.values()):
        for media_type, media in kind.openapi(None).items():
            content[media_type] = _merge(content[media_type], media) if media_type in content else media
    return {"required": True, "content": content}


def _merge(first: dict[str, Any], second: dict[str, Any]) -> dict[str, Any]:
    # JSON job bodies stay one flat object with the option fields; only "inputs" becomes a oneOf.
    a, b = first["schema"], second["schema"]
    if "inputs" in a.get("properties", {}) and "inputs" in b.get("properties", {}):
        choices = [*_choices(a["properties"]["inputs"]), *_choices(b["properties"]["inputs"])]
        return {"schema": {**a, "properties": {**a["properties"], "inputs": {"oneOf": choices}}}}
    if a == b:
        return first
    return {"schema": {"oneOf": [*_choices(a), *_choices(b)]}}


def _choices(schema: dict[str, Any]) -> list[dict[str, Any]]:
    return list(schema["oneOf"]) if set(schema) == {"oneOf"} else [schema]
