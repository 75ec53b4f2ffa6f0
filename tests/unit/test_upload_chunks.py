"""A bulk upload's chunks (shared/lifecycle/upload.py) hold each item's bytes themselves, decoded once at upload;
its lines read as ``json.loads`` reads them, whichever parser ran (api/bulk_upload.py). No Redis."""

from __future__ import annotations

import base64
import json
import os
from pathlib import Path
from typing import Any, cast

import pytest

from inferq.api.bulk_upload import LineChecker, _loads
from inferq.shared.lifecycle.upload import BulkItem, _chunk_body, decode_chunk
from inferq.shared.models import ModelConfig
from inferq.shared.settings import Settings

ITEMS = [
    BulkItem("a", os.urandom(3000) + b"\n\n" + os.urandom(10), "image/jpeg", None),
    BulkItem(
        "line\nbreak \u00e9 \U0001f600", b"", "image/png", {"traceparent": "00-" + "1" * 32 + "-" + "2" * 16 + "-01"}
    ),
    BulkItem("c", b'{"inputs": [1, 2]}', "application/json", None),
]


def test_a_chunk_gives_back_its_items_exactly() -> None:
    assert decode_chunk(_chunk_body(ITEMS)) == ITEMS


def test_a_chunk_holds_the_bytes_not_base64() -> None:
    """An image line's base64 was decoded at upload, then stored as base64 inside JSON again (a third of the
    line's API cost, and a third more bytes through Redis)."""
    images = [BulkItem(f"i{n}", os.urandom(34_000), "image/jpeg", None) for n in range(8)]
    body = _chunk_body(images)
    assert len(body) < 1.01 * sum(len(i.payload) for i in images)
    assert all(i.payload in body for i in images)


def test_a_chunk_stored_before_the_binary_body_still_reads() -> None:
    """Chunks staged by the previous release (JSON, base64 payloads) are read by the new worker."""
    old = {
        "items": [
            {"custom_id": i.custom_id, "content_type": i.content_type, "payload": base64.b64encode(i.payload).decode()}
            | ({"trace": i.trace} if i.trace else {})
            for i in ITEMS
        ]
    }
    assert decode_chunk(json.dumps(old, separators=(",", ":")).encode()) == ITEMS


@pytest.mark.parametrize(
    "line",
    [
        b'{"custom_id": "x", "inputs": [NaN, Infinity]}',
        b'{"custom_id": "\\ud800", "inputs": [1]}',
        b'{"custom_id": "x", "custom_id": "y"}',
        b'{"custom_id": "x", "image": "' + base64.b64encode(os.urandom(999)) + b'", "inputs": [1.5e308, -0.0]}',
    ],
)
def test_a_line_reads_as_json_loads_reads_it(line: bytes) -> None:
    assert repr(_loads(line)) == repr(json.loads(line))


def test_only_an_image_models_lines_go_to_orjson(tmp_path: Path) -> None:
    """orjson reads an integer past 64 bits as a float: a model that reads numbers keeps ``json``'s."""
    line = b'{"custom_id": "x", "inputs": [123456789012345678901234567890]}'
    assert repr(_loads(line)) != repr(json.loads(line))
    settings = Settings(models_dir=tmp_path)
    tensor = ModelConfig.model_validate({"name": "t", "input": {"kind": "tensor", "shape": [1]}})
    image = ModelConfig.model_validate({"name": "i", "input": {"kind": "image", "size": [8, 8]}})
    assert LineChecker(tensor, settings, cast(Any, None)).loads is json.loads
    assert LineChecker(image, settings, cast(Any, None)).loads is _loads


@pytest.mark.parametrize("line", [b'{"custom_id": ', b"\xff\xfe", b"[" * 100_000, b'{"a": 1} {"b": 2}'])
def test_a_bad_line_gets_json_loads_own_error(line: bytes) -> None:
    with pytest.raises((ValueError, RecursionError)) as ours:
        _loads(line)
    with pytest.raises((ValueError, RecursionError)) as theirs:
        json.loads(line)
    assert type(ours.value) is type(theirs.value) and str(ours.value) == str(theirs.value)
