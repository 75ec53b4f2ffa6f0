"""The Open Inference Protocol v2 (REST) over inferq's jobs, so Triton's and KServe's clients work unchanged.

An infer request is an ordinary job: checked by the model's input kind like a /v1 submit, queued on the
model's queue (batched with everything else, visible in ``rq info``), then waited for up to ``max_wait_s``.
inferq's extension for asynchronous use: ``Prefer: respond-async`` answers 202 with the job's ID and
``Location``, and the job is read through /v1/jobs/{id}. Errors are the protocol's ``{"error": "..."}``
(api/errors.py). These routes follow the protocol's own specification, not /openapi.json.
"""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Header, Request, Response
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse

from inferq.api.auth import Owner, submitted_by
from inferq.api.deps import AppState, Model, State, routed_model, served_model
from inferq.api.errors import error_response
from inferq.api.inputs import prefer_wait, read_body
from inferq.api.oip import codec
from inferq.api.routers.jobs import wait_for_end
from inferq.shared import keys, shards, tracing
from inferq.shared.errors import InvalidInput, NotFound, UnsupportedMedia
from inferq.shared.inputs import input_kind
from inferq.shared.jobs import Submission, enqueue_job_async, isoformat, public_status
from inferq.shared.models import ModelConfig
from inferq.shared.settings import Settings

router = APIRouter(prefix="/v2", tags=["open inference protocol"], include_in_schema=False)
SERVER_NAME = "inferq"
SERVER_VERSION = "0.1.0"
EXTENSIONS = ["binary_tensor_data", "inferq_respond_async"]
# A job that ended without a result, as an infer call's answer: (status, what the caller reads).
_ENDED = {
    "failed": (500, "failed"),
    "canceled": (409, "was canceled"),
    "expired": (503, "expired in its queue: no worker took it before its deadline"),
}


async def _version_config(model: str, version: str, state: State, _owner: Owner) -> ModelConfig:
    """The config of the version a ``/versions/{version}`` path names (the caller's key checked first)."""
    served_model(state, model)  # an unknown or invalid model's 404
    # ASCII digits only: str.isdigit() is true of "²", which int() refuses (that was a 500).
    if not (version.isascii() and version.isdigit()):
        raise InvalidInput(f"a version is a number in ASCII digits, got {version[:50]!r}")
    versions = state.versions.versions(model)
    number = int(version) if len(version) < 10 else None
    if number not in versions:
        served = ", ".join(map(str, versions))
        raise NotFound(f"model {model} has no version {version[:50]!r} (it has: {served})")
    return versions[number]


async def _routed(model: str, state: State, _owner: Owner) -> ModelConfig:
    """The version an unversioned infer runs on, as the model's traffic shares route it (the protocol pins a
    version by its path, never by a query); the caller's key checked first."""
    return await routed_model(state, model, None)


Versioned = Annotated[ModelConfig, Depends(_version_config)]
RoutedInfer = Annotated[ModelConfig, Depends(_routed)]


@router.get("/health/live")
async def live() -> dict[str, bool]:
    """The process is up."""
    return {"live": True}


@router.get("/health/ready")
async def ready(state: State) -> dict[str, bool]:
    """INFERQ_REDIS_URL's Redis answers (503 otherwise). Another Redis down leaves the server ready: only its own
    models are not (``/v2/models/{m}/ready``), as /readyz shows them."""
    await state.home.aredis.ping()
    return {"ready": True}


@router.get("")
async def server_metadata() -> dict[str, Any]:
    """The server's name, version and protocol extensions."""
    return {"name": SERVER_NAME, "version": SERVER_VERSION, "extensions": EXTENSIONS}


@router.get("/models/{model}")
async def model_metadata(config: Model, state: State, owner: Owner) -> dict[str, Any]:
    """The model's input and outputs (its highest version's), with datatypes and shapes, and its versions."""
    return codec.metadata(config, list(state.versions.versions(config.name)))


@router.get("/models/{model}/versions/{version}")
async def version_metadata(config: Versioned, state: State, owner: Owner) -> dict[str, Any]:
    """One version's input and outputs."""
    return codec.metadata(config, list(state.versions.versions(config.name)))


@router.get("/models/{model}/ready")
async def model_ready(config: Model, state: State, owner: Owner) -> Response:
    """200 while a worker serves some version of the model; 400 (the protocol's "false") while its jobs would wait."""
    serving, _ = await state.versions.serving(state.for_model(config).aredis, config.name)
    if serving:
        return JSONResponse({"name": config.name, "ready": True})
    message = f"model {config.name} has no live worker: its jobs wait in its queue until one starts"
    return error_response(400, "not_ready", message, flat=True)


@router.get("/models/{model}/versions/{version}/ready")
async def version_ready(config: Versioned, state: State, owner: Owner) -> Response:
    """200 while a worker serves this version; 400 while its jobs would only wait."""
    serving, _ = await state.versions.serving(state.for_model(config).aredis, config.name)
    if config.version in serving:
        return JSONResponse({"name": config.name, "version": str(config.version), "ready": True})
    message = f"version {config.version} of model {config.name} has no live worker: its jobs wait until one starts"
    return error_response(400, "not_ready", message, flat=True)


def _prefers_async(prefer: str | None) -> bool:
    tokens = (part.split("=")[0].strip().lower() for part in (prefer or "").replace(";", ",").split(","))
    return "respond-async" in tokens


def _submission(config: ModelConfig, settings: Settings, value: Any) -> Submission:
    """The request's input checked by the model's input kind, as a /v1 submit is."""
    kind = input_kind(config.input)
    if isinstance(value, bytes):
        if kind.from_bytes is not None:
            # The kind's own raw media type: application/octet-stream for images, text/plain for text.
            media_type = next(media for media in kind.media_types if not media.endswith("/*"))
            payload = kind.from_bytes(config.input, value, media_type, config.name, settings)
        else:
            assert kind.from_json is not None
            try:
                document = json.loads(value)
            except (ValueError, RecursionError) as exc:
                raise InvalidInput(f"input {kind.name!r} must hold a JSON document: {exc}") from None
            payload = kind.from_json(config.input, document, config.name, settings)
    else:
        assert kind.from_json is not None
        payload = kind.from_json(config.input, value, config.name, settings)
    return Submission(config.served, payload.data, payload.content_type)


@router.post("/models/{model}/infer")
async def infer(
    request: Request,
    config: RoutedInfer,
    state: State,
    owner: Owner,
    prefer: Annotated[str | None, Header()] = None,
    idempotency_key: Annotated[str | None, Header(max_length=200)] = None,
) -> Response:
    """Run one item through the model (the version its traffic shares route it to) as a job."""
    return await _infer(request, config, state, owner, prefer, idempotency_key, pinned=None)


@router.post("/models/{model}/versions/{version}/infer")
async def infer_version(
    request: Request,
    config: Versioned,
    state: State,
    owner: Owner,
    prefer: Annotated[str | None, Header()] = None,
    idempotency_key: Annotated[str | None, Header(max_length=200)] = None,
) -> Response:
    """Run one item through this version of the model as a job."""
    return await _infer(request, config, state, owner, prefer, idempotency_key, pinned=config.version)


async def _infer(
    request: Request,
    config: ModelConfig,
    state: AppState,
    owner: str | None,
    prefer: str | None,
    idempotency_key: str | None,
    pinned: int | None,
) -> Response:
    """Run one item through ``config`` as a job and answer with its outputs (202 with its ID if asked)."""
    settings = state.settings
    encoding = request.headers.get("content-encoding", "identity").strip().lower()
    if encoding != "identity":
        raise UnsupportedMedia(f"Content-Encoding {encoding[:20]} is not supported: send the request uncompressed")
    respond_async = _prefers_async(prefer)
    # Without respond-async the call waits as long as the deployment lets it; wait=N shortens that.
    wait_s = prefer_wait(prefer, settings.max_wait_s) or (0.0 if respond_async else settings.max_wait_s)
    body = await read_body(request, settings.max_body_bytes)
    parsed = await run_in_threadpool(codec.parse_request, config, body, request.headers.get(codec.HEADER_LENGTH))
    submission = replace(
        await run_in_threadpool(_submission, config, settings, parsed.value),
        retries=config.retries,
        max_queue_length=config.max_queue_length,
        idempotency_key=idempotency_key or None,
        pinned=pinned,
        owner=owner,
        **submitted_by(request),
    )
    shard = state.for_model(config)
    with tracing.submit_span(request.headers, config.served, "/v2/models/{model}/infer") as traced:
        if traced is not None:
            submission = replace(submission, trace=traced.stored)
        job = await enqueue_job_async(shard.aredis, settings, submission, shards.new_id(shard.name), waited=wait_s > 0)
        if traced is not None:
            traced.queued(job.id, keys.queue_name(submission.model, submission.lane))
    location = f"{str(request.base_url).rstrip('/')}/v1/jobs/{job.id}"
    view = await wait_for_end(state, job.id, wait_s, owner) if wait_s > 0 else None
    if view is not None and view["status"] == "finished":
        content, headers = await run_in_threadpool(codec.encode_response, config, parsed, job.id, view["result"])
        return Response(content, 200, headers=headers)
    if respond_async:
        accepted = {
            "id": job.id,
            "status": view["status"] if view else public_status(job.status),
            "model": config.name,
            "version": config.version if job.version is None else job.version,
            "created_at": isoformat(job.created_at),
            "enqueued_at": isoformat(job.enqueued_at),
            "urls": {
                name: f"{location}{suffix}"
                for name, suffix in (("self", ""), ("events", "/events"), ("cancel", "/cancel"))
            },
        }
        return JSONResponse(accepted, 202, headers={"Location": location, "Preference-Applied": "respond-async"})
    assert view is not None
    headers = {"Location": location}
    if view["status"] in _ENDED:
        status, what = _ENDED[view["status"]]
        reason = f": {view['error']}" if view.get("error") and view["status"] != "expired" else ""
        message = f"job {job.id} {what}{reason}"
        return error_response(status, view["status"], message, headers, flat=True, job_id=job.id)
    message = (
        f"job {job.id} is still {view['status']} after {wait_s:g} s; it goes on: read it at {location}, "
        "or send Prefer: respond-async to be answered at once"
    )
    return error_response(504, "timeout", message, headers, flat=True, job_id=job.id)
