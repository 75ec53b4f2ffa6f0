"""Hostile bodies are refused quickly with a 4xx, and never stall the API's event loop (issue 8, defect 9)."""

from __future__ import annotations

import asyncio
import io
import json
import struct
import zlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx
import pytest
from PIL import Image

from inferq.api import inputs
from inferq.api.app import create_app
from inferq.api.bulk_upload import CUSTOM_ID_MAX, LineChecker
from inferq.api.schemas import WEBHOOK_MAX_CHARS
from inferq.shared.errors import PayloadTooLarge
from inferq.shared.inputs import input_kind
from inferq.shared.inputs.tensor import FLOAT_MAX, INT64_MIN
from inferq.shared.lifecycle.upload import BulkItem
from inferq.shared.models import ModelConfig
from inferq.shared.settings import Settings
from tests.support.models import write_models

DEEP = [4, 3, 1, 5, 2, 8]
CONFIGS: dict[str, dict[str, Any]] = {
    "pair": {"handler": "tests.support.echo:SlowEcho", "weights": "none", "input": {"kind": "tensor", "shape": [2]}},
    "grid": {"handler": "tests.support.echo:SlowEcho", "weights": "none", "input": {"kind": "tensor", "shape": [2, 2]}},
    "deep": {
        "handler": "tests.support.echo:SlowEcho",
        "weights": "none",
        "input": {"kind": "tensor", "shape": DEEP, "dtype": "float64"},
    },
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


def test_a_huge_flat_tensor_is_refused_unparsed(settings: Settings, monkeypatch: pytest.MonkeyPatch) -> None:
    body = b'{"inputs": [' + b",".join([b"0.5"] * 2_500_000) + b"]}"  # 10 MiB for a model taking 2 numbers
    # json's C parser holds the GIL, even in the threadpool: a body this far past what the model's shape can need
    # is refused by its size, so no request waits on its parse. The refusal is ready before /healthz is asked,
    # so which of the two ends first says nothing; that the body was never parsed says it all.
    parsed: list[int] = []
    real = inputs._json_body

    def spy(body: bytes) -> Any:
        parsed.append(len(body))
        return real(body)

    monkeypatch.setattr(inputs, "_json_body", spy)
    response, order = _race(settings, "POST", "/v1/models/pair/jobs", content=body, headers=_json)
    assert response.status_code == 413
    assert response.json()["error"] == {
        "code": "payload_too_large",
        "message": f"the body is {len(body)} bytes; model pair takes 2 numbers (a tensor of shape [2]), "
        "so a JSON body for it is at most 65760 bytes",
    }
    assert parsed == [] and sorted(order) == ["healthz", "heavy"]


def _largest_body(shape: list[int], dtype: str, indent: int | str | None, settings: Settings) -> str:
    """The longest JSON body a model of this shape takes: every number at its longest, every option at its most."""
    number: float | int = INT64_MIN if dtype == "int64" else -FLOAT_MAX[dtype]
    tensor: Any = number
    for size in reversed(shape):
        tensor = [tensor] * size
    host = "http://127.0.0.1:9/"
    document = {
        "inputs": tensor,
        # json.dumps writes each character outside the BMP as two \\u escapes: 12 bytes.
        "webhook": host + "\U0001f600" * (WEBHOOK_MAX_CHARS - len(host)),
        "priority": "interactive",
        "result_ttl": settings.max_result_ttl_s,
        "ttl": settings.queue_ttl_s,
    }
    return json.dumps(document, indent=indent)


def test_the_largest_pretty_printed_tensor_body_is_taken(settings: Settings) -> None:
    settings = settings.model_copy(update={"webhook_allow": ["127.0.0.1"]})
    body = _largest_body(DEEP, "float64", 4, settings)
    assert body.count("-1.7976931348623157e+308") == 960 and len(body) > inputs.INLINE_CHECK_BYTES
    response, _ = _race(settings, "POST", "/v1/models/deep/jobs", content=body, headers=_json)
    assert response.status_code == 202, response.text


@pytest.mark.parametrize("dtype", ["float32", "float64", "int64"])
@pytest.mark.parametrize("shape", [[], [0], [1], [2], [2, 2], DEEP, [1] * 12, [3, 1, 4, 1, 5]])
def test_no_legitimate_tensor_body_is_over_the_bound(settings: Settings, shape: list[int], dtype: str) -> None:
    config = ModelConfig(name="m", weights="none", input={"kind": "tensor", "shape": shape, "dtype": dtype})
    kind = input_kind(config.input)
    for indent in (None, 0, 1, 2, 4, 8, 16, "\t"):
        body = _largest_body(shape, dtype, indent, settings)
        for encoding in ("utf-8", "utf-8-sig", "utf-16", "utf-32"):
            inputs.check_json_size(config, kind, body.encode(encoding))
            # A JSONL line is one line of the same fields, a custom_id in place of the options.
            line = {"custom_id": "\U0001f600" * CUSTOM_ID_MAX, "inputs": json.loads(body)["inputs"]}
            inputs.check_json_size(config, kind, json.dumps(line).encode(encoding), "line")
    assert kind.json_bound is not None
    limit = kind.json_bound(config.input).chars + inputs.JSON_FIELDS_CHARS
    inputs.check_json_size(config, kind, b" " * limit)
    refusal = f"^the body is {limit + 1} bytes; model m takes .* at most {limit} bytes$"
    with pytest.raises(PayloadTooLarge, match=refusal):
        inputs.check_json_size(config, kind, b" " * (limit + 1))


class _Sink:
    """What a BatchWriter takes from the line checker, kept."""

    def __init__(self) -> None:
        self.items: list[BulkItem] = []
        self.failed: list[str] = []

    def check_ids(self, pairs: Sequence[tuple[str, int]]) -> list[int]:
        return [0] * len(pairs)

    def add(self, item: BulkItem) -> None:
        self.items.append(item)

    def fail(self, line: str) -> None:
        self.failed.append(line)


def test_a_jsonl_line_far_past_the_tensor_bound_is_refused_alone(settings: Settings) -> None:
    config = ModelConfig(name="pair", weights="none", input={"kind": "tensor", "shape": [2]})
    huge = b'{"custom_id": "b", "inputs": [' + b",".join([b"0.5"] * 100_000) + b"]}"
    sink = _Sink()
    checker = LineChecker(config, settings, sink)
    checker.take([(1, b'{"custom_id": "a", "inputs": [1, 2]}'), (2, huge)])
    assert [item.custom_id for item in sink.items] == ["a"]
    assert checker.refusals.shown == [
        {
            "line": 2,
            "custom_id": None,
            "error": f"line 2: the line is {len(huge)} bytes; model pair takes 2 numbers (a tensor of shape [2]), "
            "so a JSON line for it is at most 65760 bytes",
        }
    ]


def test_json_nested_deeper_than_the_model_takes_is_a_422(settings: Settings) -> None:
    deep = '{"inputs": ' + "[" * 500 + "]" * 500 + "}"
    response, _ = _race(settings, "POST", "/v1/models/grid/jobs", content=deep, headers=_json)
    assert response.status_code == 422
    assert response.json()["error"]["message"] == "inputs: expected an array of length 2, got length 1"
    deeper = '{"inputs": ' + "[" * 30_000 + "]" * 30_000 + "}"  # within the bound, past json's recursion limit
    response, _ = _race(settings, "POST", "/v1/models/grid/jobs", content=deeper, headers=_json)
    assert response.status_code == 422
    assert response.json()["error"]["message"].startswith("the body is not valid JSON")
    deepest = '{"inputs": ' + "[" * 100_000 + "]" * 100_000 + "}"  # past the bound: refused unparsed
    response, _ = _race(settings, "POST", "/v1/models/grid/jobs", content=deepest, headers=_json)
    assert response.status_code == 413


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
