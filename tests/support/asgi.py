"""The API in-process: requests through httpx.ASGITransport to one app, its lifespan (Redis, event hub) around them."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx

from inferq.api.app import create_app
from inferq.shared.settings import Settings


def call_api(settings: Settings, *requests: tuple[str, str, dict[str, Any]]) -> list[httpx.Response]:
    async def run() -> list[httpx.Response]:
        app = create_app(settings)
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://inferq", timeout=60) as client:
                return [await client.request(method, path, **kwargs) for method, path, kwargs in requests]

    return asyncio.run(run())
