"""Bulk batches: upload JSONL, read progress, stream result lines, cancel."""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Header, Query, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.datastructures import UploadFile

from api.auth import Owner
from api.deps import Model, State
from api.inputs import check_json_size, read_body
from api.schemas import ERRORS
from shared import keys
from shared.errors import AppError, Conflict, InvalidInput, NotFound
from shared.inputs import input_kind
from shared.jobs import new_job_id
from shared.lifecycle import bulk
from shared.lifecycle.bulk import BulkItem, NewBatch
from shared.models import ModelConfig
from shared.settings import Settings
from shared.urls import check_webhook_target_async

router = APIRouter(tags=["batches"])


class JSONLResponse(StreamingResponse):
    media_type = "application/jsonl"


CUSTOM_ID_MAX = 256
# How many refused lines the upload's answer lists (all of them are counted).
REFUSED_SHOWN = 100
RESULTS_PAGE = 1000
_LINE_FIELDS = {"custom_id", "inputs", "image"}
_UPLOAD_BODY = {
    "requestBody": {
        "required": True,
        "content": {
            "application/jsonl": {"schema": {"type": "string", "description": "one JSON item per line"}},
            "multipart/form-data": {
                "schema": {
                    "type": "object",
                    "required": ["file"],
                    "properties": {"file": {"type": "string", "format": "binary"}},
                }
            },
        },
    }
}


@dataclass
class Upload:
    """An upload's lines, checked as single submits are."""

    items: list[BulkItem] = field(default_factory=list)
    # Result lines of refused lines that carry a usable custom_id: they count, and fail alone.
    failed_lines: list[str] = field(default_factory=list)
    refused: list[dict[str, Any]] = field(default_factory=list)


def parse_upload(config: ModelConfig, body: bytes, settings: Settings) -> Upload:
    """One item per JSONL line; a bad line is refused alone, by line number and custom_id."""
    kind = input_kind(config.input)
    upload = Upload()
    seen: dict[str, int] = {}
    for number, raw in enumerate(body.split(b"\n"), start=1):
        if not raw.strip():
            continue
        custom_id: str | None = None
        try:
            check_json_size(config, kind, raw, "line")
            try:
                line = json.loads(raw)
            except (ValueError, RecursionError) as exc:
                raise InvalidInput(f"not valid JSON: {exc}") from None
            if not isinstance(line, dict):
                raise InvalidInput("each line must be a JSON object")
            candidate = line.get("custom_id")
            if not isinstance(candidate, str) or not 1 <= len(candidate) <= CUSTOM_ID_MAX:
                raise InvalidInput(f"custom_id must be a string of 1 to {CUSTOM_ID_MAX} characters")
            if not _is_unicode(candidate):
                raise InvalidInput("custom_id must be Unicode text: it holds a lone UTF-16 surrogate (\\ud800-\\udfff)")
            if candidate in seen:
                raise InvalidInput(f"custom_id {candidate!r} repeats line {seen[candidate]}")
            seen[candidate] = number
            custom_id = candidate
            unknown = set(line) - _LINE_FIELDS
            if unknown:
                raise InvalidInput(f"unknown fields: {', '.join(sorted(unknown))}")
            upload.items.append(_item(config, kind, line, custom_id, settings))
        except AppError as exc:
            error = f"line {number}: {exc.message}"
            upload.refused.append({"line": number, "custom_id": custom_id, "error": error})
            if custom_id is not None:
                line_out = {"custom_id": custom_id, "status": "failed", "error": error}
                upload.failed_lines.append(json.dumps(line_out, separators=(",", ":")))
    return upload


def _is_unicode(text: str) -> bool:
    # json.loads takes a lone surrogate escape; such a string has no UTF-8 form, and Redis's cjson refuses it.
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


def _item(config: ModelConfig, kind: Any, line: dict[str, Any], custom_id: str, settings: Settings) -> BulkItem:
    if "inputs" in line and kind.from_json is not None:
        payload = kind.from_json(config.input, line["inputs"], config.name, settings)
    elif "image" in line and kind.from_bytes is not None:
        if not isinstance(line["image"], str):
            raise InvalidInput("image must be a base64 string")
        try:
            data = base64.b64decode(line["image"], validate=True)
        except (binascii.Error, ValueError):
            raise InvalidInput("image is not valid base64") from None
        payload = kind.from_bytes(config.input, data, "", config.name, settings)
    else:
        field_name = "inputs" if kind.from_json is not None else "image"
        raise InvalidInput(f"each line needs '{field_name}': model {config.name} takes {kind.takes}")
    return BulkItem(custom_id, payload.data, payload.content_type)


def _urls(request: Request, batch_id: str) -> dict[str, str]:
    base = str(request.base_url).rstrip("/")
    return {
        "self": f"{base}/v1/batches/{batch_id}",
        "results": f"{base}/v1/batches/{batch_id}/results",
        "cancel": f"{base}/v1/batches/{batch_id}/cancel",
    }


async def _upload_body(request: Request, settings: Settings) -> bytes:
    body = await read_body(request, settings.max_batch_bytes)
    media_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if media_type != "multipart/form-data":
        return body
    try:
        form = await request.form(max_files=1, max_fields=5, max_part_size=settings.max_batch_bytes)
    except Exception as exc:  # Starlette raises its own types for malformed multipart
        raise InvalidInput(f"malformed multipart body: {exc}") from None
    try:
        upload = form.get("file")
        if not isinstance(upload, UploadFile):
            raise InvalidInput("the form needs a 'file' field holding the JSONL")
        return await upload.read()
    finally:
        await form.close()


@router.post("/v1/models/{model}/batches", status_code=202, responses=ERRORS, openapi_extra=_UPLOAD_BODY)
async def submit_batch(
    request: Request,
    config: Model,
    state: State,
    owner: Owner,
    webhook: Annotated[str | None, Query(description="called once when the batch ends", max_length=2048)] = None,
    result_ttl: Annotated[int | None, Query(description="seconds results stay readable after the end", ge=1)] = None,
    priority: Annotated[Literal["interactive", "bulk"], Query(description="the lane its items wait in")] = "bulk",
    idempotency_key: Annotated[
        str | None, Header(description="the same key and body return the same batch", max_length=200)
    ] = None,
) -> JSONResponse:
    """Queue a JSONL file of items (one `{"custom_id", "inputs" | "image"}` per line); answers 202 at once."""
    settings = state.settings
    if result_ttl is not None and result_ttl > settings.max_result_ttl_s:
        raise InvalidInput(f"result_ttl must be at most {settings.max_result_ttl_s} seconds")
    body = await _upload_body(request, settings)
    upload = await run_in_threadpool(parse_upload, config, body, settings)
    if not upload.items:
        shown = "; ".join(r["error"] for r in upload.refused[:3]) or "the upload has no lines"
        raise InvalidInput(f"no line of the upload is a valid item: {shown}")
    if webhook:
        await check_webhook_target_async(webhook, settings.webhook_allow)
    batch_id = new_job_id()
    fingerprint = hashlib.sha256(json.dumps([config.name, priority, webhook, result_ttl]).encode() + b"\0" + body)
    idempotency = None
    if idempotency_key:
        stored = f"{batch_id} {fingerprint.hexdigest()}"
        idempotency = (keys.idempotency_key(owner or "", f"batch\0{idempotency_key}"), stored)
    max_batch = min(config.max_batch, settings.max_batch or config.max_batch)
    new = NewBatch(
        batch_id,
        config.name,
        priority,
        chunk_size=max_batch,
        result_ttl_s=result_ttl or settings.result_ttl_s,
        items=upload.items,
        refused=upload.failed_lines,
        owner=owner,
        webhook=webhook,
        idempotency=idempotency,
    )
    verdict, existing = await run_in_threadpool(bulk.enqueue_batch, state.redis, settings, new)
    if verdict == "dup":
        other_id, _, other_fingerprint = existing.partition(" ")
        if other_fingerprint != fingerprint.hexdigest():
            raise InvalidInput("this Idempotency-Key was used with a different request body")
        batch_id = other_id
    view = await run_in_threadpool(bulk.read_batch, state.redis, batch_id, owner)
    if view is None:
        raise NotFound(f"the batch {batch_id} of this Idempotency-Key has expired")
    answer = {
        **view,
        "total": view["counts"]["total"],
        "refused_count": len(upload.refused),
        "refused": upload.refused[:REFUSED_SHOWN],
        "urls": _urls(request, batch_id),
    }
    return JSONResponse(answer, status_code=202, headers={"Location": answer["urls"]["self"]})


@router.get("/v1/batches/{batch_id}", responses=ERRORS)
async def get_batch(request: Request, batch_id: str, state: State, owner: Owner) -> dict[str, Any]:
    """The batch's status, item counts, rate and estimated time left."""
    view = await run_in_threadpool(bulk.read_batch, state.redis, batch_id, owner)
    if view is None:
        raise NotFound(f"no batch {batch_id!r} (unknown, or its results expired)")
    return {**view, "urls": _urls(request, batch_id)}


@router.get(
    "/v1/batches/{batch_id}/results",
    responses={
        200: {"content": {"application/jsonl": {"schema": {"type": "string"}}}, "description": "JSONL"},
        **ERRORS,
    },
)
async def batch_results(
    batch_id: str,
    state: State,
    owner: Owner,
    status: Annotated[
        Literal["finished", "failed", "canceled", "expired"] | None, Query(description="only lines of this status")
    ] = None,
    offset: Annotated[int, Query(description="skip this many lines (what a follower already read)", ge=0)] = 0,
) -> JSONLResponse:
    """One JSON line per ended item, in the order they ended: all of them once the batch has ended."""
    if await run_in_threadpool(bulk.read_batch, state.redis, batch_id, owner) is None:
        raise NotFound(f"no batch {batch_id!r} (unknown, or its results expired)")

    async def lines() -> AsyncIterator[bytes]:
        start = offset
        while True:
            page = await run_in_threadpool(bulk.result_lines, state.redis, batch_id, start, RESULTS_PAGE)
            for line in page:
                if status is None or json.loads(line).get("status") == status:
                    yield line + b"\n"
            if len(page) < RESULTS_PAGE:
                return
            start += len(page)

    return JSONLResponse(lines())


@router.post("/v1/batches/{batch_id}/cancel", responses=ERRORS)
async def cancel_batch(request: Request, batch_id: str, state: State, owner: Owner) -> dict[str, Any]:
    """Cancel the items not yet run; lines already finished are kept. A batch that ended answers 409."""
    verdict = await run_in_threadpool(bulk.cancel_batch, state.redis, state.settings, batch_id, owner)
    if verdict == "missing":
        raise NotFound(f"no batch {batch_id!r} (unknown, or its results expired)")
    if verdict == "ended":
        raise Conflict(f"batch {batch_id} has already ended")
    return await get_batch(request, batch_id, state, owner)
