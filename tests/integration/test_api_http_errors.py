"""Starlette's own HTTP errors through inferq's error handler (httpx.ASGITransport, real redis-server)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import HTTPException

from inferq.api.app import create_app
from inferq.shared.settings import Settings
from tests.support.models import make_models_dir


@pytest.fixture
def settings(tmp_path: Path, redis_url: str) -> Settings:
    return Settings(redis_url=redis_url, models_dir=make_models_dir(tmp_path / "models"))


def calls(settings: Settings, requests: list[tuple[str, str]], extra_route: bool = False) -> list[httpx.Response]:
    """Each (method, path) against one app, its lifespan running around them."""

    async def run() -> list[httpx.Response]:
        app = create_app(settings)
        if extra_route:

            @app.get("/teapot")
            async def teapot() -> None:
                raise HTTPException(418, "short and stout", headers={"X-Brew": "earl grey", "Retry-After": "7"})

        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://inferq") as client:
                return [await client.request(method, path) for method, path in requests]

    return asyncio.run(run())


def test_every_operation_answers_an_undeclared_method_with_405_and_allow(settings: Settings) -> None:
    document: dict[str, Any] = calls(settings, [("GET", "/openapi.json")])[0].json()
    paths = sorted(document["paths"])
    assert len(paths) >= 8
    requests = [("TRACE", path.replace("{job_id}", "j1").replace("{model}", "digits")) for path in paths]
    for path, response in zip(paths, calls(settings, requests), strict=True):
        declared = {method.upper() for method in document["paths"][path]}
        assert response.status_code == 405, (path, response.text)
        assert response.json() == {"error": {"code": "method_not_allowed", "message": "Method Not Allowed"}}
        allowed = {method.strip() for method in response.headers["allow"].split(",")}
        # Starlette answers HEAD wherever GET is served.
        assert allowed - {"HEAD"} == declared, path


def test_an_http_exception_keeps_every_header_it_carried(settings: Settings) -> None:
    (response,) = calls(settings, [("GET", "/teapot")], extra_route=True)
    assert response.status_code == 418
    assert response.json() == {"error": {"code": "http_error", "message": "short and stout"}}
    assert response.headers["x-brew"] == "earl grey"
    assert response.headers["retry-after"] == "7"
