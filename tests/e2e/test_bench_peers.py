"""The benchmark's peers (bench/peers/) serve the digits model behind the shared HTTP contract (LitServe behind its
own: a multipart upload to /predict, as its users write it).

Each peer runs as real processes, the way bench/run.py starts them, on a private redis-server.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from inferq.shared.redis_server import RedisServer, die_with_parent, free_port
from tests.support.models import ROOT

MODEL_DIR = ROOT / "models" / "digits"
ITEMS = 3


@pytest.fixture(scope="module")
def peer_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """A redis-server of this module's own; never the machine's one on 6379."""
    server = RedisServer(tmp_path_factory.mktemp("peers-redis"), appendonly=False)
    server.start()
    try:
        yield server
    finally:
        server.stop()


class Peer:
    """One peer's processes, each with its log under log_dir; stop() ends every one."""

    def __init__(self, module: str, log_dir: Path) -> None:
        self.module = f"bench.peers.{module}"
        self.log_dir = log_dir
        self.procs: list[tuple[str, subprocess.Popen[bytes]]] = []

    def start(self, role: str, *args: str) -> None:
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        with open(self.log_dir / f"{role}.log", "wb") as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", self.module, role, *args],
                cwd=ROOT,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                # Its own process group: uvicorn's worker processes go with it if it must be killed.
                start_new_session=True,
                preexec_fn=die_with_parent,
            )
        self.procs.append((role, proc))

    def wait_healthy(self, base: str, timeout_s: float = 30.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for role, proc in self.procs:
                if proc.poll() is not None:
                    raise AssertionError(f"{self.module} {role} exited with {proc.returncode}:\n{self.logs()}")
            try:
                if httpx.get(f"{base}/healthz", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise AssertionError(f"{base}/healthz did not answer 200 within {timeout_s} s:\n{self.logs()}")

    def logs(self) -> str:
        return "\n".join(
            f"--- {path.name}\n{path.read_text(errors='replace')[-3000:]}" for path in self.log_dir.iterdir()
        )

    def stop(self) -> None:
        for _, proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for _, proc in self.procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            # uvicorn's workers, should the supervisor have left any behind.
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
        self.procs.clear()


@pytest.fixture
def peer(tmp_path: Path) -> Iterator[Any]:
    """Starts a peer's processes; every one is stopped when the test ends, passed or not."""
    started: list[Peer] = []

    def start(module: str) -> Peer:
        running = Peer(module, tmp_path)
        started.append(running)
        return running

    try:
        yield start
    finally:
        for running in started:
            running.stop()


def run_digits(running: Peer, base: str, digits_heldout: tuple[list[bytes], list[str]]) -> None:
    """Three held-out digits through the contract: POST /jobs, then GET /jobs/{id}?wait= when queued."""
    running.wait_healthy(base)
    images, labels = digits_heldout
    with httpx.Client(base_url=base, timeout=60) as client:
        accepted = []
        for image in images[:ITEMS]:
            response = client.post("/jobs", content=image, headers={"content-type": "image/png"})
            assert response.status_code in (200, 202), response.text
            accepted.append(response)
        for response, label in zip(accepted, labels[:ITEMS], strict=True):
            body = response.json()
            if response.status_code == 202:
                assert isinstance(body["id"], str) and body["id"]
                # The worker may still be loading the model: a long wait covers its start.
                job = client.get(f"/jobs/{body['id']}", params={"wait": 30})
                assert job.status_code == 200, job.text
                body = job.json()
            else:
                assert body["id"] is None
            assert body["status"] == "finished", f"{body}\n{running.logs()}"
            assert body["result"]["label"] == label, body


def test_plain_rq(peer: Any, peer_redis: RedisServer, digits_heldout: tuple[list[bytes], list[str]]) -> None:
    running = peer("plain_rq")
    port = free_port()
    running.start("api", "--port", str(port), "--redis-url", peer_redis.url)
    running.start("worker", "--redis-url", peer_redis.url, "--model-dir", str(MODEL_DIR), "--threads", "1")
    base = f"http://127.0.0.1:{port}"
    run_digits(running, base, digits_heldout)
    # The contract's other answers: an input the model refuses fails alone; an unknown id is 404.
    with httpx.Client(base_url=base, timeout=30) as client:
        job_id = client.post("/jobs", content=b"not an image", headers={"content-type": "image/png"}).json()["id"]
        failed = client.get(f"/jobs/{job_id}", params={"wait": 10}).json()
        assert failed["status"] == "failed" and "could not decode image" in failed["error"]
        assert client.get("/jobs/no-such-job", params={"wait": 1}).status_code == 404


def test_sync_fastapi(peer: Any, digits_heldout: tuple[list[bytes], list[str]]) -> None:
    running = peer("sync_fastapi")
    port = free_port()
    running.start("api", "--port", str(port), "--model-dir", str(MODEL_DIR), "--workers", "2", "--threads", "1")
    base = f"http://127.0.0.1:{port}"
    run_digits(running, base, digits_heldout)
    with httpx.Client(base_url=base, timeout=30) as client:
        refused = client.post("/jobs", content=b"not an image", headers={"content-type": "image/png"})
        assert refused.status_code == 415 and refused.json()["status"] == "failed"


def test_celery_batches(peer: Any, peer_redis: RedisServer, digits_heldout: tuple[list[bytes], list[str]]) -> None:
    pytest.importorskip("celery")
    pytest.importorskip("celery_batches")
    running = peer("celery_batches")
    port = free_port()
    running.start("api", "--port", str(port), "--redis-url", peer_redis.url)
    running.start("worker", "--redis-url", peer_redis.url, "--model-dir", str(MODEL_DIR), "--threads", "1")
    base = f"http://127.0.0.1:{port}"
    run_digits(running, base, digits_heldout)
    with httpx.Client(base_url=base, timeout=30) as client:
        job_id = client.post("/jobs", content=b"not an image", headers={"content-type": "image/png"}).json()["id"]
        failed = client.get(f"/jobs/{job_id}", params={"wait": 10}).json()
        assert failed["status"] == "failed" and "could not decode image" in failed["error"]
        # A bad input fails alone: the batch goes on.
        ok = client.post("/jobs", content=digits_heldout[0][0], headers={"content-type": "image/png"}).json()["id"]
        assert client.get(f"/jobs/{ok}", params={"wait": 10}).json()["status"] == "finished"


def test_litserve(peer: Any, digits_heldout: tuple[list[bytes], list[str]]) -> None:
    """LitServe batches concurrent uploads (max batch 8) and answers each with its own digit."""
    pytest.importorskip("litserve")
    from concurrent.futures import ThreadPoolExecutor

    from bench.vs_litserve import multipart

    running = peer("litserve_peer")
    port = free_port()
    running.start("api", "--port", str(port), "--model-dir", str(MODEL_DIR), "--threads", "1", "--max-batch", "8")
    base = f"http://127.0.0.1:{port}"
    running.wait_healthy(base, timeout_s=120)
    images, labels = digits_heldout
    count = min(len(images), 24)

    def predict(image: bytes) -> dict[str, Any]:
        body, content_type = multipart("file", "digit.png", "image/png", image)
        response = httpx.post(f"{base}/predict", content=body, headers={"content-type": content_type}, timeout=60)
        assert response.status_code == 200, f"{response.text}\n{running.logs()}"
        return dict(response.json())

    alone = [predict(image) for image in images[:count]]  # one at a time: batches of one
    with ThreadPoolExecutor(8) as pool:
        together = list(pool.map(predict, images[:count]))
    assert [a["status"] for a in together] == ["finished"] * count
    assert [a["result"]["label"] for a in alone[:ITEMS]] == labels[:ITEMS]
    # Batched with others, each upload gets the answer it got alone: its own.
    assert [a["result"]["label"] for a in together] == [a["result"]["label"] for a in alone]


def test_litserve_text(peer: Any, tmp_path: Path) -> None:
    """The langid text model behind LitServe (--text): JSON {"input"}, batches padded to their longest text, the
    token counts kept in --stats; each text gets the answer it gets alone."""
    pytest.importorskip("litserve")
    from concurrent.futures import ThreadPoolExecutor

    from bench.vs_litserve import padding_waste, texts

    running = peer("litserve_peer")
    port = free_port()
    stats = tmp_path / "stats.json"
    model = ROOT / "models" / "langid"
    args = ["--port", str(port), "--model-dir", str(model), "--threads", "1", "--max-batch", "16"]
    running.start("api", *args, "--text", "--stats", str(stats), "--batch-timeout", "0.05")
    base = f"http://127.0.0.1:{port}"
    running.wait_healthy(base, timeout_s=120)
    corpus = texts(48, seed=1)

    def predict(text: str) -> dict[str, Any]:
        response = httpx.post(f"{base}/predict", json={"input": text}, timeout=60)
        assert response.status_code == 200, f"{response.text}\n{running.logs()}"
        return dict(response.json())

    alone = [predict(text) for text in corpus[:12]]  # one at a time: batches of one, no padding
    assert json.loads(stats.read_text())["padded_tokens"] == json.loads(stats.read_text())["tokens"]
    with ThreadPoolExecutor(16) as pool:
        together = list(pool.map(predict, corpus))
    assert [a["result"]["label"] for a in together[:12]] == [a["result"]["label"] for a in alone]
    counts = json.loads(stats.read_text())
    assert counts["items"] == 12 + 48 and counts["batches"] < counts["items"]  # batched
    assert (padding_waste(counts) or 0) > 0  # texts of different lengths in one batch: padded to the longest
