"""What every input kind provides: its checks, the payload it stores, and how it describes itself in OpenAPI."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from pydantic import BaseModel

from inferq.shared.settings import Settings

Spec = TypeVar("Spec", bound=BaseModel)


@dataclass(frozen=True)
class Payload:
    """The bytes stored for the worker, and the content type the worker's handler reads them as."""

    data: bytes
    content_type: str


@dataclass(frozen=True)
class JsonBound:
    """The most characters a legitimate JSON "inputs" value can take, however it is formatted, and what it holds."""

    chars: int
    holds: str  # completes "model X takes ...", e.g. "2 numbers (a tensor of shape [2])"


@dataclass(frozen=True)
class InputKind(Generic[Spec]):
    """One input kind: the bodies it takes, the checks that turn them into a Payload, its OpenAPI."""

    name: str
    config: type[Spec]
    # Completes "model X takes ..." in the 415 answer to any other content type.
    takes: str
    # The JSON Schema of one model's input by media type, exactly what the checks below accept: for
    # application/json the "inputs" value, for multipart/form-data the "file" part, otherwise the whole body.
    # The API wraps them in its request models (the job options) to build that model's submit schema.
    openapi: Callable[[Spec], dict[str, dict[str, Any]]]
    # (spec, the "inputs" value of an application/json body, model name, settings)
    from_json: Callable[[Spec, Any, str, Settings], Payload] | None = None
    # (spec, a raw body or multipart "file", its Content-Type as sent, model name, settings)
    from_bytes: Callable[[Spec, bytes, str, str, Settings], Payload] | None = None
    # Raw body media types for from_bytes; "type/*" matches the whole type.
    media_types: tuple[str, ...] = ()
    # Whether a multipart/form-data body's "file" field goes to from_bytes.
    multipart: bool = False
    # For kinds whose spec fixes the input's size: a JSON body (or JSONL line) far past it is refused unparsed.
    json_bound: Callable[[Spec], JsonBound] | None = None
    # An "inputs" value of a JSON body the spec takes, as the status page's playground suggests it (GET /v1/status);
    # None where it has none to show.
    example: Callable[[Spec], Any] | None = None

    def takes_media(self, media_type: str) -> bool:
        """Whether a raw body of ``media_type`` (lower case, no parameters) goes to from_bytes."""
        return any(
            media_type == pattern or (pattern.endswith("/*") and media_type.startswith(pattern[:-1]))
            for pattern in self.media_types
        )


def json_type(value: Any) -> str:
    """The JSON name of a parsed JSON value's type, for messages."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object"
