"""HTTP plumbing for submits: body limits, content types, job options, Prefer; input kinds check the input."""

from __future__ import annotations

import json
import math
import re
from typing import Any

from fastapi import Request
from fastapi.concurrency import run_in_threadpool
from pydantic import AnyHttpUrl, TypeAdapter, ValidationError
from starlette.datastructures import UploadFile

from shared.errors import InvalidInput, PayloadTooLarge, UnsupportedMedia
from shared.inputs import InputKind, input_kind
from shared.jobs import Submission
from shared.models import ModelConfig
from shared.settings import Settings

_URL = TypeAdapter(AnyHttpUrl)
_PREFER_WAIT = re.compile(r"(?:^|[,;\s])wait\s*=\s*\"?([^\s,;\"]*)\"?", re.IGNORECASE)
_FORM_FIELDS = {"file", "webhook", "result_ttl", "ttl"}
_JSON_FIELDS = {"inputs", "webhook", "result_ttl", "ttl"}


async def read_body(request: Request, max_body_bytes: int) -> bytes:
    """The whole body, refusing it as soon as it passes the limit (chunked bodies too)."""
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > max_body_bytes:
        raise PayloadTooLarge(f"request body is {declared} bytes; the limit is {max_body_bytes}")
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > max_body_bytes:
            raise PayloadTooLarge(f"request body is over the limit of {max_body_bytes} bytes")
        chunks.append(chunk)
    body = b"".join(chunks)
    # Starlette's form parser reads the cached body instead of the consumed stream.
    request._body = body
    return body


def parse_wait(value: str | None, max_wait_s: float, source: str) -> float:
    """Seconds to wait, from ``Prefer: wait=N`` or ``?wait=N``; 0 when absent."""
    if value is None or value == "":
        return 0.0
    try:
        seconds = float(value)
    except ValueError:
        raise InvalidInput(f"{source}: wait must be a number of seconds, got {value!r}") from None
    if not math.isfinite(seconds) or seconds < 0 or seconds > max_wait_s:
        raise InvalidInput(f"{source}: wait must be between 0 and {max_wait_s:g} seconds, got {value!r}")
    return seconds


def prefer_wait(header: str | None, max_wait_s: float) -> float:
    if not header:
        return 0.0
    match = _PREFER_WAIT.search(header)
    return parse_wait(match.group(1), max_wait_s, "Prefer") if match else 0.0


def _webhook(value: Any) -> str | None:
    if value is None or value == "":
        return None
    if not isinstance(value, str) or len(value) > 2048:
        raise InvalidInput("webhook must be an http(s) URL of at most 2048 characters")
    try:
        return str(_URL.validate_python(value))
    except ValidationError:
        raise InvalidInput(f"webhook must be an http(s) URL, got {value[:100]!r}") from None


def _result_ttl(value: Any, settings: Settings) -> int | None:
    return _seconds(value, "result_ttl", settings.max_result_ttl_s)


def _seconds(value: Any, name: str, most: int) -> int | None:
    """A whole number of seconds in 1..most, or None when absent."""
    if value is None or value == "":
        return None
    if isinstance(value, bool):
        raise InvalidInput(f"{name} must be a whole number of seconds")
    try:
        seconds = int(value)
        if isinstance(value, float) and seconds != value:
            raise ValueError
    except (TypeError, ValueError, OverflowError):
        raise InvalidInput(f"{name} must be a whole number of seconds, got {str(value)[:50]!r}") from None
    if not 1 <= seconds <= most:
        raise InvalidInput(f"{name} must be between 1 and {most} seconds")
    return seconds


def _json_body(body: bytes) -> Any:
    try:
        return json.loads(body, parse_constant=_reject_constant)
    except (ValueError, RecursionError) as exc:
        raise InvalidInput(f"the body is not valid JSON: {exc}") from None


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not allowed")


async def parse_submission(request: Request, config: ModelConfig, body: bytes, settings: Settings) -> Submission:
    """Check a job request for ``config`` and turn it into a Submission; the model's input kind checks the input."""
    header = request.headers.get("content-type", "")
    media_type = header.split(";")[0].strip().lower()
    kind = input_kind(config.input)
    # Parsing and checking a body of up to max_body_bytes is CPU work: off the event loop, so one hostile
    # body never stalls other requests.
    if media_type == "application/json" and kind.from_json is not None:
        return await run_in_threadpool(_json_submission, config, kind, body, settings)
    if media_type == "multipart/form-data" and kind.multipart:
        return await _multipart_submission(request, config, kind, settings)
    if kind.from_bytes is not None and kind.takes_media(media_type):
        payload = await run_in_threadpool(kind.from_bytes, config.input, body, header, config.name, settings)
        return Submission(config.name, payload.data, payload.content_type)
    raise UnsupportedMedia(f"model {config.name} takes {kind.takes}")


def _json_submission(config: ModelConfig, kind: InputKind[Any], body: bytes, settings: Settings) -> Submission:
    assert kind.from_json is not None
    data = _json_body(body)
    if not isinstance(data, dict) or "inputs" not in data:
        raise InvalidInput(
            f"the body must be a JSON object with an 'inputs' field; model {config.name} takes {kind.takes}"
        )
    unknown = set(data) - _JSON_FIELDS
    if unknown:
        raise InvalidInput(f"unknown fields: {', '.join(sorted(unknown))}")
    payload = kind.from_json(config.input, data["inputs"], config.name, settings)
    return Submission(
        config.name,
        payload.data,
        payload.content_type,
        webhook=_webhook(data.get("webhook")),
        result_ttl_s=_result_ttl(data.get("result_ttl"), settings),
        deadline_s=_seconds(data.get("ttl"), "ttl", settings.queue_ttl_s),
    )


async def _multipart_submission(
    request: Request, config: ModelConfig, kind: InputKind[Any], settings: Settings
) -> Submission:
    assert kind.from_bytes is not None
    try:
        form = await request.form(max_files=1, max_fields=10)
    except Exception as exc:  # Starlette raises its own types for malformed multipart
        raise InvalidInput(f"malformed multipart body: {exc}") from None
    try:
        unknown = set(form.keys()) - _FORM_FIELDS
        if unknown:
            raise InvalidInput(f"unknown form fields: {', '.join(sorted(unknown))}")
        upload = form.get("file")
        if not isinstance(upload, UploadFile):
            raise InvalidInput(f"the form needs a 'file' field holding the {kind.name}")
        data = await upload.read()
        payload = await run_in_threadpool(
            kind.from_bytes, config.input, data, upload.content_type or "", config.name, settings
        )
        webhook = form.get("webhook")
        result_ttl = form.get("result_ttl")
        deadline = form.get("ttl")
        return Submission(
            config.name,
            payload.data,
            payload.content_type,
            webhook=_webhook(webhook if isinstance(webhook, str) else None),
            result_ttl_s=_result_ttl(result_ttl if isinstance(result_ttl, str) else None, settings),
            deadline_s=_seconds(deadline if isinstance(deadline, str) else None, "ttl", settings.queue_ttl_s),
        )
    finally:
        await form.close()
