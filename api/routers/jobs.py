"""Jobs: submit, read (optionally waiting), stream events, cancel.

The routes whose OpenAPI comes from this deployment are declared here too (``router_for``): one submit path
per model, with that model's own request body (its input kind, its option limits, built from the request
models the API validates with, api/schemas.py), and the job read with this deployment's ?wait= cap, so
/openapi.json says what the API does.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import replace
from typing import Annotated, Any

from fastapi import APIRouter, Header, Query, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from inferq.api.auth import Owner, require_key, submitted_by
from inferq.api.deps import VERSION_DOC, AppState, Pinned, Routed, Shard, State, routed_model, state_of
from inferq.api.events import STOPPING
from inferq.api.inputs import parse_submission, prefer_wait, read_body
from inferq.api.schemas import ERRORS, request_body
from inferq.shared import keys, shards, tracing
from inferq.shared.inputs import input_kind
from inferq.shared.jobs import (
    TERMINAL,
    Submission,
    cancel_job_async,
    enqueue_job_async,
    get_job_view_async,
    isoformat,
    public_status,
    view_from_event,
)
from inferq.shared.lifecycle.submit import Enqueued
from inferq.shared.models import ModelConfig, ModelRepository
from inferq.shared.settings import Settings
from inferq.shared.urls import check_webhook_target_async
from inferq.shared.view import JobAccepted, JobView, encode_view

router = APIRouter(tags=["jobs"])
# Waiters re-read the job this often even without an event, so a lost event only delays them.
RECHECK_S = 5.0
SSE_KEEPALIVE_S = 15.0


def _urls(request: Request, job_id: str) -> dict[str, str]:
    base = str(request.base_url).rstrip("/")
    return {
        "self": f"{base}/v1/jobs/{job_id}",
        "events": f"{base}/v1/jobs/{job_id}/events",
        "cancel": f"{base}/v1/jobs/{job_id}/cancel",
    }


async def _view(state: AppState, job_id: str, owner: str | None) -> dict[str, Any]:
    return await get_job_view_async(state.for_id(job_id).aredis, job_id, owner)


def view_response(view: dict[str, Any], status_code: int = 200, headers: dict[str, str] | None = None) -> Response:
    """A job's view as every route answers with it (``encode_view``): the same bytes for the same job."""
    return Response(encode_view(view), status_code, headers, media_type="application/json")


async def wait_for_end(state: AppState, job_id: str, timeout_s: float, owner: str | None) -> dict[str, Any]:
    """The job's view once it is terminal, or as it is when ``timeout_s`` passes."""
    deadline = time.monotonic() + timeout_s
    with state.for_id(job_id).events.subscribe(job_id, ends_only=True) as events:
        # Subscribed before reading, so an end between the read and the wait is not missed.
        view = await _view(state, job_id, owner)
        known = (view["model"], view["version"], view["created_at"])
        return await _until_end(state, job_id, owner, events, deadline, view, known) or view


async def _until_end(
    state: AppState,
    job_id: str,
    owner: str | None,
    events: asyncio.Queue[dict[str, Any]],
    deadline: float,
    view: dict[str, Any] | None,
    known: tuple[str, int, str | None],
) -> dict[str, Any] | None:
    """Wait on ``events`` until the job is terminal or ``deadline`` passes; its latest view, if one was read.

    ``known``: the job's model, version and created_at. With them, an end event that carries the job's view (a waited
    job's, ``shared.jobs.ended_view``) is the answer: no read.
    """
    while view is None or view["status"] not in TERMINAL:
        left = deadline - time.monotonic()
        if left <= 0:
            break
        until_deadline = left <= RECHECK_S
        try:
            async with asyncio.timeout(min(left, RECHECK_S)):  # no task per wait, as wait_for makes
                event = await events.get()
            if event is STOPPING:  # the API stops: answered now, as a wait that ran out is (a submit by its 202)
                return None if view is None else await _view(state, job_id, owner)
            if event.get("status") not in TERMINAL:
                continue
            carried = view_from_event(event, job_id, *known)
            if carried is not None:
                return carried
        except TimeoutError:
            # The submit answers 202 with what it knows: no read to tell it "queued". (Not the clock: uvloop's
            # timers have millisecond steps and may fire a fraction early.)
            if view is None and until_deadline:
                break
        view = await _view(state, job_id, owner)
    return view


async def _enqueue_and_wait(
    state: AppState, shard: Shard, submission: Submission, wait_s: float, owner: str | None
) -> tuple[Enqueued, dict[str, Any] | None]:
    """Enqueue, then wait up to ``wait_s`` for the end: the job, and its view if it was read."""
    deadline = time.monotonic() + wait_s
    job_id = shards.new_id(shard.name)
    with shard.events.subscribe(job_id, ends_only=True) as events:
        # Subscribed before the job exists, so no end can come unseen: no read of a job known to be queued.
        job = await enqueue_job_async(shard.aredis, state.settings, submission, job_id, waited=True)
        if job.id == job_id:
            known = (*keys.split_served(submission.model), isoformat(job.created_at))
            return job, await _until_end(state, job_id, owner, events, deadline, None, known)
    # An Idempotency-Key's earlier job: it may have ended already.
    return job, await wait_for_end(state, job.id, max(0.0, deadline - time.monotonic()), owner)


async def _submit(
    request: Request,
    config: ModelConfig,
    state: AppState,
    owner: str | None,
    prefer: str | None,
    idempotency_key: str | None,
    traced: tracing.Submitted | None,
    pinned: int | None,
) -> tuple[Enqueued, dict[str, Any] | None, float]:
    """Parse, check and enqueue a submit (and wait, ``Prefer: wait``): the job, its view if read, the wait."""
    settings = state.settings
    wait_s = prefer_wait(prefer, settings.max_wait_s)
    body = await read_body(request, settings.max_body_bytes)
    submission = replace(
        await parse_submission(request, config, body, settings),
        retries=config.retries,
        max_queue_length=config.max_queue_length,
        idempotency_key=idempotency_key or None,
        pinned=pinned,
        owner=owner,
        **submitted_by(request),
        trace=traced.stored if traced is not None else None,
    )
    if submission.webhook:
        await check_webhook_target_async(submission.webhook, settings.webhook_allow)
    shard = state.for_model(config)
    if wait_s > 0:
        job, view = await _enqueue_and_wait(state, shard, submission, wait_s, owner)
    else:
        job_id = shards.new_id(shard.name)
        job, view = await enqueue_job_async(shard.aredis, settings, submission, job_id), None
    if traced is not None:
        traced.queued(job.id, keys.queue_name(submission.model, submission.lane))
    return job, view, wait_s


# Each model's own path, with its own request body, is in the schema (router_for); this one
# answers the rest: an unknown model's 404.
@router.post("/v1/models/{model}/jobs", status_code=202, include_in_schema=False)
async def submit_job(
    request: Request,
    config: Routed,
    state: State,
    owner: Owner,
    pinned: Pinned,
    prefer: Annotated[str | None, Header(description="wait=N: hold up to N seconds for the result")] = None,
    idempotency_key: Annotated[
        str | None, Header(description="the same key and body return the same job", max_length=200)
    ] = None,
) -> Response:
    """Queue one input for the model; answers 202 with the job ID at once."""
    with tracing.submit_span(request.headers, config.served, "/v1/models/{model}/jobs") as traced:
        job, view, wait_s = await _submit(request, config, state, owner, prefer, idempotency_key, traced, pinned)
    urls = _urls(request, job.id)
    headers = {"Location": urls["self"]}
    if wait_s > 0:
        headers["Preference-Applied"] = f"wait={wait_s:g}"
        if view is not None and view["status"] in TERMINAL:
            return view_response(view, 200, headers)
    accepted = {
        "id": job.id,
        "status": public_status(job.status),
        "model": config.name,
        "version": config.version if job.version is None else job.version,  # an Idempotency-Key's job: its own
        "created_at": isoformat(job.created_at),
        "enqueued_at": isoformat(job.enqueued_at),
        "urls": urls,
    }
    return JSONResponse(accepted, status_code=202, headers=headers)


# Routed by router_for, where ?wait= is declared with this deployment's cap.
async def get_job(job_id: str, state: State, owner: Owner, wait_s: float) -> Response:
    """The job's status, and its result or error once it ended."""
    if wait_s > 0:
        return view_response(await wait_for_end(state, job_id, wait_s, owner))
    return view_response(await _view(state, job_id, owner))


@router.post("/v1/jobs/{job_id}/cancel", response_model=JobView, responses=ERRORS)
async def cancel(job_id: str, state: State, owner: Owner) -> Response:
    """Cancel a queued or running job; a job that already ended answers 409."""
    await cancel_job_async(state.for_id(job_id).aredis, state.settings, job_id, owner)
    return view_response(await _view(state, job_id, owner))


def _sse(view: dict[str, Any]) -> str:
    # encode_view escapes every line break inside strings: the data is one line, as an SSE field must be.
    return f"event: {view['status']}\ndata: {encode_view(view).decode()}\n\n"


@router.get(
    "/v1/jobs/{job_id}/events",
    responses={200: {"content": {"text/event-stream": {}}}, **ERRORS},
    response_class=StreamingResponse,
)
async def job_events(job_id: str, request: Request, state: State, owner: Owner) -> StreamingResponse:
    """Server-Sent Events: one per status change, ending with the terminal one."""
    first = await _view(state, job_id, owner)  # 404 before the stream starts

    async def stream() -> AsyncIterator[str]:
        with state.for_id(job_id).events.subscribe(job_id) as events:
            view = await _view(state, job_id, owner)
            yield _sse(view)
            last = view["status"]
            while last not in TERMINAL:
                if await request.is_disconnected():
                    return
                try:
                    event = await asyncio.wait_for(events.get(), timeout=SSE_KEEPALIVE_S)
                except TimeoutError:
                    yield ": keep-alive\n\n"
                else:
                    if event is STOPPING:  # the API stops: the stream ends (an EventSource connects again by itself)
                        return
                view = await _view(state, job_id, owner)
                if view["status"] != last:
                    last = view["status"]
                    yield _sse(view)

    del first
    return StreamingResponse(stream(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})


# -- the routes whose OpenAPI comes from this deployment ----------------------------------------------
Submit = Callable[..., Awaitable[Response]]


def router_for(settings: Settings, configs: ModelRepository) -> APIRouter:
    """The submit path of every model in ``configs`` and the job read, as ``settings`` bound them. A model's path
    documents its highest version's input; a submit is parsed as the version it is routed to takes it."""
    router = APIRouter(tags=["jobs"])
    for name in configs.models():
        versions = configs.versions(name)
        config = versions[max(versions)]
        router.add_api_route(
            f"/v1/models/{name}/jobs",
            _submitter(config, settings),
            methods=["POST"],
            status_code=202,
            response_model=JobAccepted,
            responses={200: {"model": JobView, "description": "finished within Prefer: wait"}, **ERRORS},
            openapi_extra={"requestBody": request_body(config, settings)},
            name=f"submit_job_{name}",
            summary=f"Submit a job to {name}",
            description=f"Queue one input for {name}, which takes {input_kind(config.input).takes}; "
            "answers 202 with the job ID at once.",
        )

    max_wait_s = settings.max_wait_s

    async def read_job(
        job_id: str,
        state: State,
        owner: Owner,
        wait: float | None = Query(  # noqa: B008 - FastAPI's way to give a parameter bounds known at run time
            None,
            ge=0,
            le=max_wait_s,
            allow_inf_nan=False,
            description=f"seconds (at most {max_wait_s:g}) to hold the request until the job ends",
        ),
    ) -> Response:
        return await get_job(job_id, state, owner, wait or 0.0)

    router.add_api_route(
        "/v1/jobs/{job_id}",
        read_job,
        name="get_job",  # the OpenAPI operation id it always had
        methods=["GET"],
        response_model=JobView,
        responses=ERRORS,
        summary="Get Job",
        description=get_job.__doc__,
    )
    return router


def _submitter(config: ModelConfig, settings: Settings) -> Submit:
    """The submit route of ``config``'s model (its highest version at start documents its body)."""
    prefer_doc = f"wait=N: hold up to N seconds (at most {settings.max_wait_s:g}) for the result"

    async def submit(
        request: Request,
        prefer: str | None = Header(None, description=prefer_doc),  # noqa: B008 - as above
        idempotency_key: str | None = Header(  # noqa: B008 - as above
            None, description="the same key and body return the same job", max_length=200
        ),
        version: int | None = Query(None, ge=1, description=VERSION_DOC),  # noqa: B008 - as above
    ) -> Response:
        # The key checked here rather than as the Owner dependency: the busiest route, and FastAPI solves each
        # dependency in a pass of its own over the path, query, headers and cookies. The same check, first.
        owner = await require_key(request, request.headers.get("authorization"))
        state = state_of(request)
        # The repository as it is now (the API reads it again when it changes): this model's versions of the moment.
        versions = state.versions.versions(config.name)
        if version is None and len(versions) == 1:
            routed = next(iter(versions.values()))
        else:
            routed = await routed_model(state, config.name, version)
        return await submit_job(request, routed, state, owner, version, prefer, idempotency_key)

    return submit
