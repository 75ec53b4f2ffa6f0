"""Job routes whose OpenAPI comes from this deployment: one submit path per model, and the ?wait= cap.

Each model's submit path carries that model's own request body (its input kind, its option limits), built
from the request models the API validates with (api/schemas.py), so /openapi.json says what the API does.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import APIRouter, Header, Query, Request
from fastapi.responses import JSONResponse

from api.auth import Owner, require_key
from api.deps import State, state_of
from api.routers import jobs
from api.schemas import ERRORS, request_body
from shared.inputs import input_kind
from shared.models import ModelConfig
from shared.settings import Settings
from shared.view import JobAccepted, JobView

Submit = Callable[..., Awaitable[JSONResponse]]


def router_for(settings: Settings, configs: dict[str, ModelConfig]) -> APIRouter:
    """The submit path of every model in ``configs`` and the job read, as ``settings`` bound them."""
    router = APIRouter(tags=["jobs"])
    for name in sorted(configs):
        config = configs[name]
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

    async def get_job(
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
    ) -> dict[str, Any]:
        return await jobs.get_job(job_id, state, owner, wait or 0.0)

    router.add_api_route(
        "/v1/jobs/{job_id}",
        get_job,
        methods=["GET"],
        response_model=JobView,
        responses=ERRORS,
        summary="Get Job",
        description=jobs.get_job.__doc__,
    )
    return router


def _submitter(config: ModelConfig, settings: Settings) -> Submit:
    prefer_doc = f"wait=N: hold up to N seconds (at most {settings.max_wait_s:g}) for the result"

    async def submit(
        request: Request,
        prefer: str | None = Header(None, description=prefer_doc),  # noqa: B008 - as above
        idempotency_key: str | None = Header(  # noqa: B008 - as above
            None, description="the same key and body return the same job", max_length=200
        ),
    ) -> JSONResponse:
        # The key checked here rather than as the Owner dependency: the busiest route, and FastAPI solves each
        # dependency in a pass of its own over the path, query, headers and cookies. The same check, first.
        owner = await require_key(request, request.headers.get("authorization"))
        return await jobs.submit_job(request, config, state_of(request), owner, prefer, idempotency_key)

    return submit
