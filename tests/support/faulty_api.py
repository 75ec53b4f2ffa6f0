"""The API as ``inferq api`` builds it, plus one test-only route that raises what no handler takes: how a test meets an
unhandled error in a real server without a production route for it. Served by uvicorn as a factory."""

from __future__ import annotations

from fastapi import FastAPI

from inferq.api.app import create_app as create_api

FAULT_PATH = "/test-only/fault"


def create_app() -> FastAPI:
    app = create_api()

    @app.get(FAULT_PATH)
    async def fault() -> None:
        raise RuntimeError("an injected fault")

    return app
