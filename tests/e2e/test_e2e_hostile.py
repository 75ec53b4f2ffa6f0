"""Hostile input: fuzzed images over HTTP, and pickle planted in Redis."""

from __future__ import annotations

import base64
import io
import os
import pickle
import random
import struct
import subprocess
import sys
import zlib
from pathlib import Path
from typing import Any

import httpx
from PIL import Image

from inferq.shared import keys
from inferq.shared.rqjson import JSONJob
from tests.support.stack import Stack


def _png_claiming(width: int, height: int) -> bytes:
    """A PNG whose header declares a huge image (a decompression bomb's first bytes)."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(b"\0" * 64)) + chunk(b"IEND", b"")
    )


def _image(fmt: str, size: tuple[int, int] = (32, 32)) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", size, (120, 30, 200)).save(buffer, format=fmt)
    return buffer.getvalue()


def fuzz_cases() -> list[bytes]:
    rng = random.Random(7)
    png, jpeg = _image("PNG"), _image("JPEG")
    cases = [b"", b"\x89PNG", _png_claiming(100_000, 100_000), _png_claiming(0, 0), png[:30], jpeg[:40]]
    cases += [bytes(rng.getrandbits(8) for _ in range(rng.randint(1, 4096))) for _ in range(20)]
    for _ in range(20):  # valid images with bytes flipped: headers that parse, bodies that may not
        data = bytearray(rng.choice([png, jpeg]))
        for _ in range(rng.randint(1, 8)):
            data[rng.randrange(len(data))] = rng.getrandbits(8)
        cases.append(bytes(data))
    return cases


def test_fuzzed_uploads_get_4xx_or_run_and_never_break_the_worker(stack: Stack) -> None:
    accepted = []
    with httpx.Client(base_url=stack.base, timeout=30) as client:
        for data in fuzz_cases():
            for send in (
                {"files": {"file": ("x.png", data, "image/png")}},
                {"content": data, "headers": {"content-type": "image/jpeg"}},
            ):
                response = client.post("/v1/models/digits/jobs", **send)
                assert response.status_code in (202, 413, 415, 422), response.text
                assert response.json().get("error") or response.status_code == 202
                if response.status_code == 202:
                    accepted.append(response.json()["id"])
        views = [client.get(f"/v1/jobs/{job_id}", params={"wait": 20}).json() for job_id in accepted]
    assert all(view["status"] in ("finished", "failed") for view in views)
    assert all(view["error"] for view in views if view["status"] == "failed")
    # The worker survived all of it and still answers.
    good = httpx.post(
        f"{stack.base}/v1/models/digits/jobs",
        files={"file": ("d.png", _image("PNG"), "image/png")},
        headers={"Prefer": "wait=20"},
        timeout=30,
    )
    assert good.status_code == 200 and good.json()["status"] == "finished"


class _Plant:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        return (os.system, (f"touch {self.marker}",))


def test_pickle_planted_in_a_job_and_a_result_is_never_executed(stack: Stack, tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    gadget = pickle.dumps(_Plant(marker))
    client = stack.redis()
    # A queued job whose data and meta are pickles, as an attacker with Redis access could write.
    response = httpx.post(f"{stack.base}/v1/models/slow/jobs", json={"inputs": [1, 2]})
    queued = response.json()["id"]
    client.hset(JSONJob.key_for(queued), mapping={"data": gadget, "meta": gadget})
    # A finished job whose stored result is a pickle.
    done = httpx.post(
        f"{stack.base}/v1/models/digits/jobs",
        files={"file": ("d.png", _image("PNG"), "image/png")},
        headers={"Prefer": "wait=20"},
        timeout=30,
    ).json()["id"]
    stream = f"rq:results:{done}"
    ((entry_id, fields),) = client.xrange(stream)
    client.xadd(stream, {**fields, b"return_value": base64.b64encode(gadget)})
    client.hset(JSONJob.key_for(done), "result", gadget)
    # The worker runs the planted job, the API reads both, and an operator runs `rq info`.
    stack.run_burst("slow")
    ran = httpx.get(f"{stack.base}/v1/jobs/{queued}").json()
    assert ran["status"] == "finished" and ran["result"] == {"output": [1.0, 2.0]}  # data is never read
    tampered = httpx.get(f"{stack.base}/v1/jobs/{done}")
    assert tampered.status_code == 200
    assert tampered.json()["result"] is None and "not readable" in tampered.json()["error"]
    rq = Path(sys.executable).parent / "rq"  # the venv running the tests, wherever its checkout is
    subprocess.run([str(rq), "info", "-u", stack.redis_url], capture_output=True, timeout=60)
    assert not marker.exists()
    assert client.exists(keys.info_key(queued))
    client.close()
