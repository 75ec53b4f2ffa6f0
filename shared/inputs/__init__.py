"""Input kinds, one module each: its config, its checks (run in the API, without torch), its OpenAPI.

Adding a kind is one module here with a ``KIND``, listed in ``KINDS`` and in ``Input``; the worker's
handlers read the Payload it stores.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import Field

from inferq.shared.inputs import document, image, tensor, text
from inferq.shared.inputs.base import InputKind, Payload
from inferq.shared.inputs.document import JsonInput
from inferq.shared.inputs.image import ImageInput
from inferq.shared.inputs.tensor import TensorInput
from inferq.shared.inputs.text import TextInput

__all__ = [
    "KINDS",
    "ImageInput",
    "Input",
    "InputKind",
    "JsonInput",
    "Payload",
    "TensorInput",
    "TextInput",
    "input_example",
    "input_kind",
]

KINDS: dict[str, InputKind[Any]] = {kind.name: kind for kind in (image.KIND, tensor.KIND, text.KIND, document.KIND)}
# ModelConfig.input: the config's "kind" picks the class.
Input = Annotated[ImageInput | TensorInput | TextInput | JsonInput, Field(discriminator="kind")]


def input_kind(spec: ImageInput | TensorInput | TextInput | JsonInput) -> InputKind[Any]:
    """The kind a model's input config belongs to."""
    return KINDS[spec.kind]


def input_example(spec: ImageInput | TensorInput | TextInput | JsonInput) -> Any:
    """An "inputs" value the model takes in a JSON body, as its kind builds one (``InputKind.example``); or None."""
    kind = input_kind(spec)
    return kind.example(spec) if kind.example is not None else None
