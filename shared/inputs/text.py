"""The ``text`` input kind: one UTF-8 string, which the worker tokenizes."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from inferq.shared.errors import InvalidInput, UnsupportedMedia
from inferq.shared.inputs.base import InputKind, Payload, json_type
from inferq.shared.settings import Settings

CONTENT_TYPE = "text/plain; charset=utf-8"
_UTF8 = ("utf-8", "utf8")
# The characters str.isspace() counts, spelled out so that every regex dialect (JSON Schema's, Python's) reads
# the same set; tests compare it with isspace() over all of Unicode.
SPACE_CLASS = r"\t-\r\x1c-\x20\x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000"
# What check_text accepts besides its length: something other than whitespace, and no NUL anywhere.
TEXT_PATTERN = rf"^[^\x00]*[^\x00{SPACE_CLASS}][^\x00]*$"


class TextInput(BaseModel):
    """A string of at most ``max_chars`` characters (Unicode code points)."""

    model_config = ConfigDict(extra="forbid")
    kind: Literal["text"] = "text"
    max_chars: int = Field(default=10_000, ge=1, le=1_000_000)


def check_text(spec: TextInput, text: str) -> Payload:
    """The text's UTF-8 bytes, once it is non-blank, short enough and encodable."""
    if not text:
        raise InvalidInput("the text is empty")
    if text.isspace():
        raise InvalidInput("the text is only whitespace")
    if len(text) > spec.max_chars:
        raise InvalidInput(f"the text is {len(text)} characters long; the limit is {spec.max_chars}")
    try:
        # json.loads accepts "\ud800", a lone surrogate no tokenizer (nor UTF-8) can carry.
        data = text.encode("utf-8")
    except UnicodeEncodeError as exc:
        char = text[exc.start]
        raise InvalidInput(f"the text holds a lone surrogate {char!a} at character {exc.start}") from None
    # Tokenizers and C-string code in handlers may stop at NUL: refuse it rather than truncate silently.
    nul = text.find("\x00")
    if nul >= 0:
        raise InvalidInput(f"the text holds a NUL character at character {nul}")
    return Payload(data, CONTENT_TYPE)


def from_json(spec: TextInput, inputs: Any, model: str, settings: Settings) -> Payload:
    if not isinstance(inputs, str):
        raise InvalidInput(f"inputs must be a string, got {json_type(inputs)}")
    return check_text(spec, inputs)


def from_bytes(spec: TextInput, data: bytes, content_type: str, model: str, settings: Settings) -> Payload:
    """A text/plain body: UTF-8 whether or not it says so; any other declared charset is refused."""
    charset = _charset(content_type)
    if charset is not None and charset not in _UTF8:
        raise UnsupportedMedia(f"model {model} takes text/plain in UTF-8 only, not charset={charset}")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidInput(f"the body is not valid UTF-8: byte 0x{data[exc.start]:02x} at offset {exc.start}") from None
    return check_text(spec, text)


def _charset(content_type: str) -> str | None:
    for param in content_type.split(";")[1:]:
        name, _, value = param.partition("=")
        if name.strip().lower() == "charset":
            return value.strip().strip('"').lower()
    return None


def openapi(spec: TextInput) -> dict[str, dict[str, Any]]:
    text = {"type": "string", "minLength": 1, "maxLength": spec.max_chars, "pattern": TEXT_PATTERN}
    return {"application/json": text, "text/plain": dict(text)}


KIND = InputKind(
    name="text",
    config=TextInput,
    takes="text: a JSON body {'inputs': '...'} or a text/plain body in UTF-8",
    openapi=openapi,
    from_json=from_json,
    from_bytes=from_bytes,
    media_types=("text/plain",),
)
