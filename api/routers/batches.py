"""Bulk batches: upload JSONL, read progress, stream result lines, cancel."""

from __future__ import annotations

import hashlib
import json
from collections.abc import AsyncIterator
from typing import Annotated, Any, Literal, cast

import anyio
from fastapi import APIRouter, Header, Query, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse, StreamingResponse

from inferq.api.auth import Owner, fair_order_of, tenant_of
from inferq.api.bulk_upload import LineChecker, read_upload
from inferq.api.deps import Pinned, Routed, State
from inferq.api.schemas import ERRORS
from inferq.shared import keys, shards
from inferq.shared.errors import Conflict, InvalidInput, NotFound, QueueFull, QuotaExceeded
from inferq.shared.lifecycle import bulk, upload
from inferq.shared.lifecycle.upload import BatchWriter
from inferq.shared.urls import check_webhook_target_async

router = APIRouter(tags=["batches"])


class JSONLResponse(StreamingResponse):
    media_type = "application/jsonl"


RESULTS_PAGE = 1000
# A batch's results are one Redis list, which holds at most 2^32 - 1 lines: no offset past that can skip
# a line, and a larger one made Redis refuse the LRANGE after the 200 had been sent (a body cut short).
RESULTS_OFFSET_MAX = 2**32 - 1
# How long a replayed upload waits for its first upload, still being queued, to be answered before a 409.
PENDING_WAIT_S = 10.0
# What a tenant past its bulk_lines quota is told to wait: lines run in batches, not one by one.
LINES_RETRY_S = 10
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


def _urls(request: Request, batch_id: str) -> dict[str, str]:
    base = str(request.base_url).rstrip("/")
    return {
        "self": f"{base}/v1/batches/{batch_id}",
        "results": f"{base}/v1/batches/{batch_id}/results",
        "cancel": f"{base}/v1/batches/{batch_id}/cancel",
    }


@router.post("/v1/models/{model}/batches", status_code=202, responses=ERRORS, openapi_extra=_UPLOAD_BODY)
async def submit_batch(
    request: Request,
    config: Routed,
    state: State,
    owner: Owner,
    pinned: Pinned,
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
    if webhook:
        await check_webhook_target_async(webhook, settings.webhook_allow)
    # What the client chose, as a single submit's (shared/jobs.py): the version it pinned, never the one routing chose.
    options: list[Any] = [config.name, priority, webhook, result_ttl]
    if pinned is not None:  # so the keys of unpinned uploads stored before versions counted still match
        options.append({"version": pinned})
    fingerprint = hashlib.sha256(json.dumps(options).encode() + b"\0")
    idem_key = keys.idempotency_key(owner or "", f"batch\0{idempotency_key}") if idempotency_key else None
    shard = state.for_model(config)
    held = cast(bytes | None, await shard.aredis.get(idem_key)) if idem_key else None
    if held is not None:  # a replay: the body is only read for its fingerprint, nothing is written
        await read_upload(request, settings, None, fingerprint)
        return await _replayed(request, state, owner, held.decode(), fingerprint.hexdigest())
    tenant = tenant_of(request)
    lines_limit = tenant.quotas.bulk_lines
    if lines_limit is not None:  # at the quota already: refused before a line is read (the commit checks again)
        waiting = await bulk.recount_bulk_lines_async(shard.aredis, tenant.name)
        if waiting >= lines_limit:
            raise _over_lines(tenant.name, waiting, lines_limit)
    batch_id = shards.new_id(shard.name)
    max_batch = min(config.max_batch, settings.max_batch or config.max_batch)
    result_ttl_s = result_ttl or settings.result_ttl_s
    writer = BatchWriter(
        shard.redis,
        settings,
        batch_id,
        config.served,
        priority,
        max_batch,
        result_ttl_s,
        owner,
        webhook,
        config.max_queue_length,
        **fair_order_of(request),
        bulk_lines=lines_limit,
    )
    checker = LineChecker(config, settings, writer)
    try:
        await read_upload(request, settings, checker, fingerprint if idem_key else None)
        if not writer.items:
            shown = "; ".join(r["error"] for r in checker.refusals.shown[:3]) or "the upload has no lines"
            raise InvalidInput(f"no line of the upload is a valid item: {shown}")
        idempotency = (idem_key, f"{batch_id} {fingerprint.hexdigest()}") if idem_key else None
        refusals = checker.refusals
        verdict, existing = await run_in_threadpool(writer.commit, idempotency, refusals.count, refusals.shown)
    except BaseException:
        with anyio.CancelScope(shield=True):  # a client gone mid-upload cancels this request
            await run_in_threadpool(writer.discard_quietly)
        raise
    if verdict == "dup":
        return await _replayed(request, state, owner, existing, fingerprint.hexdigest())
    if verdict == "full":
        raise QueueFull(f"the {priority} lane of model {config.name} has no room for this batch; retry later")
    if verdict == "lines":
        raise _over_lines(tenant.name, int(existing), cast(int, lines_limit), writer.items)
    if verdict == "stale":
        raise InvalidInput(f"the upload took longer than {upload.STAGE_TTL_S} seconds to arrive; send it again")
    view = await bulk.read_batch_async(shard.aredis, batch_id, owner)
    if view is None:
        raise NotFound(f"the batch {batch_id} has expired")
    return _accepted(request, view, checker.refusals.count, checker.refusals.shown)


def _over_lines(tenant: str, waiting: int, limit: int, lines: int = 0) -> QuotaExceeded:
    upload = f"; this upload has {lines}" if lines else ""
    return QuotaExceeded(
        f"tenant {tenant} is over its quota bulk_lines: {waiting} of its {limit} upload lines still wait{upload};"
        " retry once they have run",
        retry_after_s=LINES_RETRY_S,
    )


async def _replayed(request: Request, state: State, owner: str | None, held: str, fingerprint: str) -> JSONResponse:
    """The answer to an upload whose Idempotency-Key already named a batch: that batch, if the body is the same."""
    batch_id, _, held_fingerprint = held.partition(" ")
    if held_fingerprint != fingerprint:
        raise InvalidInput("this Idempotency-Key was used with a different request body")
    connection = state.for_id(batch_id).aredis
    view = await bulk.read_batch_async(connection, batch_id, owner)
    # A retry that overtook its first upload's last steps (its chunks being queued) waits for them, a while.
    waited_s = 0.0
    while view is None:
        if not await bulk.is_pending_async(connection, batch_id):
            # Shown between the read and this check (the upload's last step clears `pending`), or expired.
            view = await bulk.read_batch_async(connection, batch_id, owner)
            if view is None:
                raise NotFound(f"the batch {batch_id} of this Idempotency-Key has expired")
            break
        if waited_s >= PENDING_WAIT_S:
            raise Conflict(f"the batch {batch_id} of this Idempotency-Key is still being queued; retry")
        await anyio.sleep(0.05)
        waited_s += 0.05
        view = await bulk.read_batch_async(connection, batch_id, owner)
    count, shown = await bulk.read_refused_async(connection, batch_id)
    return _accepted(request, view, count, shown)


def _accepted(request: Request, view: dict[str, Any], refused_count: int, refused: list[Any]) -> JSONResponse:
    answer = {
        **view,
        "total": view["counts"]["total"],
        "refused_count": refused_count,
        "refused": refused,
        "urls": _urls(request, view["id"]),
    }
    return JSONResponse(answer, status_code=202, headers={"Location": answer["urls"]["self"]})


@router.get("/v1/batches/{batch_id}", responses=ERRORS)
async def get_batch(request: Request, batch_id: str, state: State, owner: Owner) -> dict[str, Any]:
    """The batch's status, item counts, rate and estimated time left."""
    view = await bulk.read_batch_async(state.for_id(batch_id).aredis, batch_id, owner)
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
    offset: Annotated[
        int, Query(description="skip this many lines (what a follower already read)", ge=0, le=RESULTS_OFFSET_MAX)
    ] = 0,
) -> JSONLResponse:
    """One JSON line per ended item, in the order they ended: all of them once the batch has ended."""
    connection = state.for_id(batch_id).aredis
    if await bulk.read_batch_async(connection, batch_id, owner) is None:
        raise NotFound(f"no batch {batch_id!r} (unknown, or its results expired)")

    async def lines() -> AsyncIterator[bytes]:
        start = offset
        while True:
            page = await bulk.result_lines_async(connection, batch_id, start, RESULTS_PAGE)
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
    verdict = await run_in_threadpool(bulk.cancel_batch, state.for_id(batch_id).redis, state.settings, batch_id, owner)
    if verdict == "missing":
        raise NotFound(f"no batch {batch_id!r} (unknown, or its results expired)")
    if verdict == "ended":
        raise Conflict(f"batch {batch_id} has already ended")
    return await get_batch(request, batch_id, state, owner)
