"""Where errors become HTTP responses: ``{"error": {"code", "message"}}``, nothing else leaks.

Under ``/v2`` (the Open Inference Protocol) the body is the protocol's flat ``{"error": "message"}``.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from typing import Any

import redis
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from inferq.shared import connections, errors

log = logging.getLogger(__name__)

STATUS = {
    errors.NotFound: 404,
    errors.UnsupportedMedia: 415,
    errors.InvalidInput: 422,
    errors.PayloadTooLarge: 413,
    errors.Conflict: 409,
    errors.QueueFull: 429,
    errors.Unauthorized: 401,
    errors.Forbidden: 403,
    errors.Unavailable: 503,
}
_HTTP_CODES = {
    404: "not_found",
    405: "method_not_allowed",
    413: "payload_too_large",
    415: "unsupported_media_type",
}


def error_response(
    status: int,
    code: str,
    message: str,
    headers: Mapping[str, str] | None = None,
    *,
    flat: bool = False,
    **extra: Any,
) -> JSONResponse:
    """The one error shape (``flat``: the /v2 one); ``headers`` (those an exception carried) win over the defaults."""
    defaults = {"Retry-After": "1"} if status in (429, 503) else {}
    if status == 401:
        defaults = {"WWW-Authenticate": "Bearer"}
    body: dict[str, Any] = (
        {"error": message, **extra} if flat else {"error": {"code": code, "message": message, **extra}}
    )
    return JSONResponse(body, status, headers={**defaults, **(headers or {})})


def status_for(exc: errors.AppError) -> int:
    for cls in type(exc).__mro__:
        if cls in STATUS:
            return STATUS[cls]
    return 500


def is_protocol_path(request: Request) -> bool:
    """Whether the request is for a /v2 (Open Inference Protocol) path."""
    # Its clients read {"error": "..."}: tritonclient's own exception fails to print a nested error object.
    path = request.url.path
    return path == "/v2" or path.startswith("/v2/")


def _describe(error: dict[str, Any]) -> str:
    where = ".".join(str(part) for part in error.get("loc", ()) if part not in ("body", "query", "path", "header"))
    return f"{where}: {error.get('msg', 'invalid')}" if where else str(error.get("msg", "invalid"))


class ServerErrors:
    """Pure ASGI middleware: an exception no handler took becomes the one 500 answer, and its connection stays usable.

    Starlette hands such an exception to its ServerErrorMiddleware, which answers with the handler below and then
    raises it again for the server to log; uvicorn closes the connection of any request whose app raised, so a
    keep-alive client's next request on it met a reset (ECONNRESET). Here it is answered and logged, not raised. One
    raised after its response started (a stream cut off mid-body) still goes on up: only closing the connection
    tells the client that body is incomplete.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def sending(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, receive, sending)
        except Exception:
            if started:
                raise
            log.exception("unhandled error")
            await _internal_error(Request(scope))(scope, receive, send)


def _internal_error(request: Request) -> JSONResponse:
    return error_response(500, "internal_error", "internal server error", flat=is_protocol_path(request))


def install(app: FastAPI) -> None:
    """Register the one place that maps exceptions to responses: call it before adding any other middleware, so that
    they all (CORS's headers, the request counts) see the 500 an unhandled exception becomes."""
    app.add_middleware(ServerErrors)

    @app.exception_handler(errors.AppError)
    async def app_error(request: Request, exc: errors.AppError) -> JSONResponse:
        headers = getattr(exc, "headers", None)  # a quota's Retry-After
        return error_response(status_for(exc), exc.code, exc.message, headers, flat=is_protocol_path(request))

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        details = [_describe(e) for e in exc.errors()]
        message = "; ".join(details) or "invalid request"
        return error_response(422, "invalid_request", message, flat=is_protocol_path(request))

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = _HTTP_CODES.get(exc.status_code, "http_error")
        # Starlette's 405 carries Allow (RFC 9110 requires it); any header an exception sets is part of its answer.
        headers = exc.headers
        if exc.status_code == 405:
            # Starlette names the methods of the first route on the path only; a path served by several (PUT and
            # DELETE of a model's rollout) allows them all.
            allowed = _allowed(request, (headers or {}).get("Allow"))
            headers = {**(headers or {}), **({"Allow": allowed} if allowed else {})}
        return error_response(exc.status_code, code, str(exc.detail), headers, flat=is_protocol_path(request))

    @app.exception_handler(redis.exceptions.RedisError)
    async def redis_error(request: Request, exc: Exception) -> JSONResponse:
        if not connections.is_unavailable(exc):
            log.exception("unexpected Redis error")
            return _internal_error(request)
        # Down, slow, paused, full, busy, loading or demoted: a retry later may succeed. The message names the
        # condition, never the Redis URL or the reply (which may carry keys).
        reason = connections.why_unavailable(exc)
        log.warning("Redis unavailable: %s (%s)", reason, type(exc).__name__)
        message = f"the job store is unavailable: {reason}; retry shortly"
        return error_response(503, "unavailable", message, flat=is_protocol_path(request))

    # What ServerErrors does not see: an exception of a middleware outside it.
    @app.exception_handler(Exception)
    async def unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error")
        return _internal_error(request)


def _allowed(request: Request, given: str | None) -> str | None:
    """The methods /openapi.json declares on the request's path, the most literal template first (/v1/models/reload
    before /v1/models/{model}); HEAD wherever GET is, as Starlette answers. Starlette's own ``given`` names only the
    first route on the path, not a second one (PUT and DELETE of a model's rollout); a path the document lacks
    keeps it."""
    paths: dict[str, dict[str, object]] = request.app.openapi().get("paths", {})
    matching = [
        template
        for template in paths
        if re.fullmatch(re.sub(r"\\\{[^/]+?\\\}", "[^/]+", re.escape(template)), request.url.path)
    ]
    if not matching:
        return given
    template = min(matching, key=lambda t: (t.count("{"), t))
    methods = {method.upper() for method in paths[template]}
    return ", ".join(sorted(methods | ({"HEAD"} if "GET" in methods else set())))
