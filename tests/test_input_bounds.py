"""Hostile bodies are refused quickly with a 4xx, and never stall the API's event loop (issue 8, defect 9)."""

from __future__ import annotations

import asyncio
import io
import struct
import zlib
from pathlib import Path
from typing import Any

import httpx
import pytest
from PIL import Image

from api.app import create_app
from shared.settings import Settings
from tests.test_inputs import write_models

CONFIGS: dict[str, dict[str, Any]] = {
    "pair": {"handler": "tests.support:SlowEcho", "weights": "none", "input": {"kind": "tensor", "shape": [2]}},
    "grid": {"handler": "tests.support:SlowEcho", "weights": "none", "input": {"kind": "tensor", "shape": [2, 2]}},
    "pic": {"handler": "image_classifier", "weights": "none", "input": {"kind": "image", "size": [8, 8]}},
}


@pytest.fixture
def settings(tmp_path: Path, redis_url: str) -> Settings:
    return Settings(redis_url=redis_url, models_dir=write_models(tmp_path / "models", CONFIGS))


def _race(settings: Settings, method: str, path: str, **kwargs: Any) -> tuple[httpx.Response, list[str]]:
    """The request, with /healthz asked while it is in flight; which of the two finished first."""

    async def run() -> tuple[httpx.Response, list[str]]:
        app = create_app(settings)
        order: list[str] = []
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://inferq", timeout=60) as client:

                async def heavy() -> httpx.Response:
                    response = await client.request(method, path, **kwargs)
                    order.append("heavy")
                    return response

                async def health() -> None:
                    await asyncio.sleep(0.05)  # the heavy request is being checked by now
                    assert (await client.get("/healthz")).status_code == 200
                    order.append("healthz")

                response, _ = await asyncio.gather(heavy(), health())
        return response, order

    return asyncio.run(run())


def test_a_huge_flat_tensor_is_refused_without_stalling_other_requests(settings: Settings) -> None:
    body = b'{"inputs": [' + b",".join([b"0.5"] * 2_500_000) + b"]}"  # 10 MiB for a model taking 2 numbers
    # The parse runs in the threadpool, but json's C parser holds the GIL while it runs, so on a loaded machine
    # the loop may get no turn before the refusal is ready. Parsed on the loop, /healthz would never come first;
    # off it, it comes first unless the machine is starved: one of three races must show it.
    orders = []
    for _ in range(3):
        response, order = _race(settings, "POST", "/v1/models/pair/jobs", content=body, headers=_json)
        assert response.status_code == 422
        assert response.json()["error"]["message"] == "inputs: expected an array of length 2, got length 2500000"
        orders.append(order)
        if order == ["healthz", "heavy"]:
            break
    assert ["healthz", "heavy"] in orders, orders


def test_json_nested_deeper_than_the_model_takes_is_a_422(settings: Settings) -> None:
    deep = '{"inputs": ' + "[" * 500 + "]" * 500 + "}"
    response, _ = _race(settings, "POST", "/v1/models/grid/jobs", content=deep, headers=_json)
    assert response.status_code == 422
    assert response.json()["error"]["message"] == "inputs: expected an array of length 2, got length 1"
    deeper = '{"inputs": ' + "[" * 100_000 + "]" * 100_000 + "}"
    response, _ = _race(settings, "POST", "/v1/models/grid/jobs", content=deeper, headers=_json)
    assert response.status_code == 422
    assert response.json()["error"]["message"].startswith("the body is not valid JSON")


def _png_chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def test_a_png_of_many_tiny_chunks_is_refused_quickly(settings: Settings) -> None:
    buffer = io.BytesIO()
    Image.new("RGB", (8, 8)).save(buffer, format="PNG")
    plain = buffer.getvalue()
    ihdr_end = 8 + 25  # signature, then the IHDR chunk
    filler = _png_chunk(b"tEXt", b"a\x00b") * 600_000
    png = plain[:ihdr_end] + filler + plain[ihdr_end:]
    response, _ = _race(settings, "POST", "/v1/models/pic/jobs", content=png, headers={"Content-Type": "image/png"})
    assert response.status_code == 422
    assert response.json()["error"]["message"] == "the PNG has more than 10000 chunks before its image data"


def test_only_the_documented_image_formats_are_opened(settings: Settings) -> None:
    buffer = io.BytesIO()
    Image.new("RGB", (8, 8)).save(buffer, format="PPM")  # Pillow reads it; inferq's docs do not name it
    response, _ = _race(settings, "POST", "/v1/models/pic/jobs", content=buffer.getvalue(), headers=_octet)
    assert response.status_code == 415
    ok = io.BytesIO()
    Image.new("RGB", (8, 8)).save(ok, format="WEBP")
    response, _ = _race(settings, "POST", "/v1/models/pic/jobs", content=ok.getvalue(), headers=_octet)
    assert response.status_code == 202


_json = {"Content-Type": "application/json"}
_octet = {"Content-Type": "application/octet-stream"}
