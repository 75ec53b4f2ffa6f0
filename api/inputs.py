"""HTTP plumbing for submits: body limits, content types, job options, Prefer; input kinds check the input."""

from __future__ import annotations

import json
import math
import re
from typing import Any

from fastapi import Request
from fastapi.concurrency import run_in_threadpool
from pydantic import BaseModel, ValidationError
from starlette.datastructures import UploadFile

from inferq.api.schemas import WEBHOOK_MAX_CHARS, JobBodies, job_bodies
from inferq.shared import keys
from inferq.shared.errors import InvalidInput, PayloadTooLarge, UnsupportedMedia
from inferq.shared.inputs import InputKind, input_kind
from inferq.shared.jobs import Submission
from inferq.shared.models import ModelConfig
from inferq.shared.settings import Settings

# Bodies up to this size are checked on the event loop: their check costs less than the hop to a thread.
# Larger ones go to the threadpool; json's C parser holds the GIL there too, so a tensor body is first held
# to the size its model's shape can need (check_json_size), and the body limit bounds the rest.
INLINE_CHECK_BYTES = 64 * 1024
# Beside the input's own bound, what the other fields of a JSON submit (or a JSONL line) may take: a webhook
# of WEBHOOK_MAX_CHARS characters written as \u escapes (12 bytes for a character outside the BMP), a
# custom_id, result_ttl, ttl, priority, their keys, and the whitespace of pretty-printing around them.
JSON_FIELDS_CHARS = 64 * 1024
# Bytes a character of JSON syntax takes in each encoding json.loads accepts (RFC 8259 asks for UTF-8).
_BYTES_PER_CHAR = {"utf-16": 2, "utf-16-le": 2, "utf-16-be": 2, "utf-32": 4, "utf-32-le": 4, "utf-32-be": 4}
_PREFER_WAIT = re.compile(r"(?:^|[,;\s])wait\s*=\s*\"?([^\s,;\"]*)\"?", re.IGNORECASE)


async def read_body(request: Request, max_body_bytes: int) -> bytes:
    """The whole body, refusing it as soon as it passes the limit (chunked bodies too)."""
    declared = request.headers.get("content-length")
    if declared and declared.isascii() and declared.isdigit() and int(declared) > max_body_bytes:
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


def _validated(model: type[BaseModel], fields: Any, what: str, missing: str, bodies: JobBodies) -> dict[str, Any]:
    """``fields`` checked by the model the OpenAPI schema shows; a readable 422 for what it refuses."""
    try:
        return dict(model.model_validate(fields))
    except ValidationError as exc:
        raise _refusal(exc, what, missing, bodies) from None


def _refusal(exc: ValidationError, what: str, missing: str, bodies: JobBodies) -> InvalidInput:
    errors = exc.errors()
    unknown = sorted(str(error["loc"][0]) for error in errors if error["type"] == "extra_forbidden")
    if unknown:
        return InvalidInput(f"unknown {what}: {', '.join(unknown)}")
    error = errors[0]
    name = str(error["loc"][0]) if error["loc"] else ""
    if error["type"] in ("missing", "model_type"):
        return InvalidInput(missing)
    shown = str(error["input"])[:100]
    if name in bodies.limits:
        if error["type"] in ("greater_than_equal", "less_than_equal"):
            return InvalidInput(f"{name} must be between 1 and {bodies.limits[name]} seconds")
        return InvalidInput(f"{name} must be a whole number of seconds, got {shown[:50]!r}")
    if name == "webhook":
        return InvalidInput(f"webhook must be an http(s) URL of at most {WEBHOOK_MAX_CHARS} characters, got {shown!r}")
    return InvalidInput(f"{name}: {error['msg']}" if name else error["msg"])


def _json_body(body: bytes) -> Any:
    try:
        return json.loads(body, parse_constant=_reject_constant)
    except (ValueError, RecursionError) as exc:
        raise InvalidInput(f"the body is not valid JSON: {exc}") from None


def check_json_size(config: ModelConfig, kind: InputKind[Any], data: bytes, what: str = "body") -> None:
    """A 413 for a JSON body (or JSONL line) far larger than any legitimate one for the model, before parsing it.

    json's C parser holds the GIL, even in the threadpool: a 10 MiB body for a model taking 2 numbers would
    stall every other request for the seconds it takes. Kinds without a ``json_bound`` are not checked here.
    """
    if kind.json_bound is None:
        return
    bound = kind.json_bound(config.input)
    limit = (bound.chars + JSON_FIELDS_CHARS) * _BYTES_PER_CHAR.get(json.detect_encoding(data[:4]), 1)
    if len(data) > limit:
        raise PayloadTooLarge(
            f"the {what} is {len(data)} bytes; model {config.name} takes {bound.holds}, "
            f"so a JSON {what} for it is at most {limit} bytes"
        )


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not allowed")


async def parse_submission(request: Request, config: ModelConfig, body: bytes, settings: Settings) -> Submission:
    """Check a job request for ``config`` and turn it into a Submission; the model's input kind checks the input."""
    header = request.headers.get("content-type", "")
    media_type = header.split(";")[0].strip().lower()
    kind = input_kind(config.input)
    inline = len(body) <= INLINE_CHECK_BYTES
    if media_type == "application/json" and kind.from_json is not None:
        check_json_size(config, kind, body)
        if inline:
            return _json_submission(config, kind, body, settings)
        return await run_in_threadpool(_json_submission, config, kind, body, settings)
    if media_type == "multipart/form-data" and kind.multipart:
        return await _multipart_submission(request, config, kind, settings)
    if kind.from_bytes is not None and kind.takes_media(media_type):
        if inline:
            payload = kind.from_bytes(config.input, body, header, config.name, settings)
        else:
            payload = await run_in_threadpool(kind.from_bytes, config.input, body, header, config.name, settings)
        return Submission(config.served, payload.data, payload.content_type)
    raise UnsupportedMedia(f"model {config.name} takes {kind.takes}")


def _json_submission(config: ModelConfig, kind: InputKind[Any], body: bytes, settings: Settings) -> Submission:
    assert kind.from_json is not None
    bodies = job_bodies(config, settings)
    assert bodies.json is not None
    data = _json_body(body)
    missing = f"the body must be a JSON object with an 'inputs' field; model {config.name} takes {kind.takes}"
    if not isinstance(data, dict) or "inputs" not in data:
        raise InvalidInput(missing)
    fields = _validated(bodies.json, data, "fields", missing, bodies)
    payload = kind.from_json(config.input, fields["inputs"], config.name, settings)
    return Submission(
        config.served,
        payload.data,
        payload.content_type,
        webhook=fields["webhook"],
        result_ttl_s=fields["result_ttl"],
        queue_ttl_s=fields["ttl"],
        lane=fields["priority"] or keys.INTERACTIVE,
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
        bodies = job_bodies(config, settings)
        assert bodies.form is not None
        missing = f"the form needs a 'file' field holding the {kind.name}"
        fields = _validated(bodies.form, dict(form.items()), "form fields", missing, bodies)
        upload = fields["file"]
        if not isinstance(upload, UploadFile):  # a text field named "file"
            raise InvalidInput(missing)
        data = await upload.read()
        payload = await run_in_threadpool(
            kind.from_bytes, config.input, data, upload.content_type or "", config.name, settings
        )
        return Submission(
            config.served,
            payload.data,
            payload.content_type,
            webhook=fields["webhook"],
            result_ttl_s=fields["result_ttl"],
            queue_ttl_s=fields["ttl"],
            lane=fields["priority"] or keys.INTERACTIVE,
        )
    finally:
        await form.close()
