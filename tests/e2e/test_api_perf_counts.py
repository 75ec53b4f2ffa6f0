"""What the API's fast paths cost, counted: threads, Redis connections, round trips, processes.

No timings: counts only. Waiting clients hold no thread and no Redis connection each; ``--workers 2`` runs
two API processes, each with its own event subscriber, each serving waits. The API's Redis client itself
(shared pipelines, scripts by hash, the async submit): tests/integration/test_api_async_redis.py.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import redis as redis_py

from inferq.api.app import REDIS_POOL_SIZE
from inferq.shared import keys
from inferq.shared.lifecycle import layout
from inferq.shared.redis_server import free_port
from tests.support.models import ROOT
from tests.support.stack import Stack, new_stack, serving
from tests.support.waiting import wait_until

DIGIT = (ROOT / "samples" / "digit.png").read_bytes()
SUBMIT = "/v1/models/digits/jobs"
WAITERS = 200


def _threads(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/task"))


def _children(pid: int) -> list[int]:
    out: list[int] = []
    for task in os.listdir(f"/proc/{pid}/task"):
        out += [int(c) for c in Path(f"/proc/{pid}/task/{task}/children").read_text().split()]
    return out


def _cmdline(pid: int) -> str:
    return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()


def _clients(client: redis_py.Redis) -> int:
    return len(client.client_list())


@contextmanager
def _in_background(coro: Any) -> Iterator[dict[str, Any]]:
    """Run ``coro`` on its own event loop in a thread; its result lands in the yielded dict."""
    out: dict[str, Any] = {}

    def run() -> None:
        try:
            out["result"] = asyncio.run(coro)
        except BaseException as exc:  # handed to the test below
            out["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        yield out
    finally:
        thread.join(timeout=90)
    if "error" in out:
        raise out["error"]


async def _waiting_submits(base: str, n: int, wait_s: float) -> list[httpx.Response]:
    limits = httpx.Limits(max_connections=n, max_keepalive_connections=n)
    async with httpx.AsyncClient(base_url=base, limits=limits, timeout=wait_s + 30) as client:
        headers = {"Content-Type": "image/png", "Prefer": f"wait={wait_s:g}"}
        return list(await asyncio.gather(*(client.post(SUBMIT, content=DIGIT, headers=headers) for _ in range(n))))


def test_waiting_requests_hold_no_thread_and_no_redis_connection_each(tmp_path: Path) -> None:
    """200 clients waiting on their jobs (no worker runs): the API's threads and Redis connections stay put."""
    with serving(new_stack(tmp_path)) as stack:
        stack.start_api()
        api_pid = stack.procs[0].pid
        client = stack.redis()
        queue = layout.queue_keys(keys.queue_name("digits", keys.INTERACTIVE)).queue
        # One submit first, so every lazily made connection and thread exists before counting.
        first = httpx.post(stack.base + SUBMIT, content=DIGIT, headers={"Content-Type": "image/png"})
        assert first.status_code == 202
        client.delete(queue)
        threads_before, clients_before = _threads(api_pid), _clients(client)
        with _in_background(_waiting_submits(stack.base, WAITERS, 60)) as out:
            wait_until(lambda: client.llen(queue) == WAITERS, 60, "every submit to be queued")
            # Queued is not yet waiting: let every request reach its wait before counting.
            wait_until(lambda: client.pubsub_numsub(keys.EVENTS_CHANNEL)[0][1] == 1, 5, "the subscriber")
            threads_during, clients_during = _threads(api_pid), _clients(client)
            for job_id in client.lrange(queue, 0, -1):
                assert httpx.post(f"{stack.base}/v1/jobs/{job_id.decode()}/cancel").status_code == 200
        responses = out["result"]
        assert [r.status_code for r in responses] == [200] * WAITERS
        assert {r.json()["status"] for r in responses} == {"canceled"}
        # A thread or a connection per waiting request would show up as +200 here.
        assert threads_during <= threads_before + 2
        assert clients_during <= clients_before + REDIS_POOL_SIZE
        client.close()


def test_a_waited_submit_reads_its_job_only_when_told_it_ended(tmp_path: Path) -> None:
    """Subscribed before the job exists, a Prefer: wait submit needs no first read of a job it knows is queued."""
    with serving(new_stack(tmp_path)) as stack:
        stack.start_api()
        client = stack.redis()
        client.config_resetstat()
        response = httpx.post(
            stack.base + SUBMIT, content=DIGIT, headers={"Content-Type": "image/png", "Prefer": "wait=0.5"}
        )
        assert response.status_code == 202 and response.json()["status"] == "queued"
        stats = client.info("commandstats")
        # No worker ran it: its input's SET and one ENQUEUE (an EVALSHA, and the EVAL that loaded the script into
        # this fresh Redis), and not one read of the job: it is known to be queued until an event says otherwise.
        assert stats["cmdstat_evalsha"]["calls"] == 1 and stats["cmdstat_eval"]["calls"] == 1
        assert stats["cmdstat_set"]["calls"] == 1
        assert "cmdstat_hgetall" not in stats and "cmdstat_pttl" not in stats
        client.close()


def test_a_waited_submit_is_answered_from_its_end_event_with_the_view_a_read_gives(tmp_path: Path) -> None:
    """The worker publishes a waited job's view with its end: the API answers from it, reading nothing.

    The same view a GET reads back, finished or failed; a job with a webhook is still read (its view lists the
    delivery attempts, which only a read can tell).
    """
    truncated = DIGIT[: len(DIGIT) // 2]  # a valid header, a broken body: only the worker can tell
    with serving(new_stack(tmp_path)) as stack:
        stack.start_api()
        stack.start_worker("digits")
        stack.wait_for_worker("digits")
        client = stack.redis()
        for body, status in ((DIGIT, "finished"), (truncated, "failed")):
            client.config_resetstat()
            response = httpx.post(
                stack.base + SUBMIT,
                content=body,
                headers={"Content-Type": "image/png", "Prefer": "wait=30"},
                timeout=40,
            )
            assert response.status_code == 200, response.text
            stats = client.info("commandstats")
            # Only a view's read sends these (the worker's scripts never do).
            assert "cmdstat_xrevrange" not in stats and "cmdstat_pttl" not in stats, status
            answered = response.json()
            assert (answered["status"], answered["webhook"]) == (status, None)
            # The same bytes a read gives (tests/e2e/test_e2e_job_views.py: every other way the job is shown too).
            assert response.content == httpx.get(f"{stack.base}/v1/jobs/{answered['id']}").content
        assert "could not decode image" in answered["error"] and answered["result"] is None

        client.config_resetstat()
        hooked = httpx.post(
            stack.base + SUBMIT,
            files={"file": ("d.png", DIGIT, "image/png")},
            data={"webhook": "http://127.0.0.1:9/hook"},
            headers={"Prefer": "wait=30"},
            timeout=40,
        )
        assert hooked.status_code == 200 and hooked.json()["status"] == "finished"
        assert hooked.json()["webhook"]["url"] == "http://127.0.0.1:9/hook"
        assert client.info("commandstats")["cmdstat_xrevrange"]["calls"] == 1
        client.close()


def _api_workers(master: int) -> list[int]:
    """uvicorn's worker processes under ``master`` (not multiprocessing's resource tracker)."""
    return [pid for pid in _children(master) if "resource_tracker" not in _cmdline(pid)]


def _wait_submit(stack: Stack) -> httpx.Response:
    # A new connection each time: whichever process accepts it serves the submit and its wait.
    return httpx.post(
        stack.base + SUBMIT, content=DIGIT, headers={"Content-Type": "image/png", "Prefer": "wait=30"}, timeout=60
    )


def test_two_api_processes_share_the_port_each_with_its_own_subscriber(tmp_path: Path) -> None:
    """INFERQ_API_WORKERS=2: two API processes, two event subscribers, and a waited submit through each."""
    with serving(new_stack(tmp_path, INFERQ_API_WORKERS="2")) as stack:
        stack.start_api()
        stack.start_worker("digits")
        stack.wait_for_worker("digits")
        client = stack.redis()
        wait_until(lambda: client.pubsub_numsub(keys.EVENTS_CHANNEL)[0][1] == 2, 30, "two event subscribers")
        workers = _api_workers(stack.procs[0].pid)
        assert len(workers) == 2
        for serving_pid in workers:
            (other,) = [pid for pid in workers if pid != serving_pid]
            # The other one stopped: only this one can accept the connection.
            os.kill(other, signal.SIGSTOP)
            try:
                response = _wait_submit(stack)
            finally:
                os.kill(other, signal.SIGCONT)
            assert response.status_code == 200, response.text
            assert response.json()["status"] == "finished"
        client.close()


def test_inferq_up_runs_the_api_workers_it_is_told_to_and_a_killed_up_takes_them_along(tmp_path: Path) -> None:
    """INFERQ_API_WORKERS reaches `inferq up`'s API; SIGKILL to `up` leaves no API process serving the port."""
    models = tmp_path / "models" / "echo"
    models.mkdir(parents=True)
    config = {"handler": "tests.support.echo:SlowEcho", "weights": "none", "input": {"kind": "tensor", "shape": [2]}}
    (models / "config.json").write_text(json.dumps(config))
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("INFERQ_")}
    env |= {
        "INFERQ_PORT": str(port),
        "INFERQ_DATA_DIR": str(tmp_path / "state"),
        "INFERQ_MODELS_DIR": str(tmp_path / "models"),
        "INFERQ_API_WORKERS": "2",
        "PYTHONPATH": str(ROOT),
    }
    log_path = tmp_path / "up.log"
    with log_path.open("wb") as log:
        up = subprocess.Popen([sys.executable, "-m", "inferq", "up"], cwd=tmp_path, env=env, stdout=log, stderr=log)
    workers: list[int] = []
    try:
        wait_until(lambda: "inferq is up" in log_path.read_text(), 60, "inferq up to start")
        found = re.search(r"Redis:\s+(redis://\S+)", log_path.read_text())
        assert found is not None
        client = redis_py.Redis.from_url(found.group(1))
        wait_until(lambda: client.pubsub_numsub(keys.EVENTS_CHANNEL)[0][1] == 2, 30, "two API subscribers")
        client.close()
        (api,) = [pid for pid in _children(up.pid) if f"--port {port}" in _cmdline(pid)]
        workers = _api_workers(api)
        assert len(workers) == 2
        response = httpx.post(
            f"http://127.0.0.1:{port}/v1/models/echo/jobs", json={"inputs": [1, 2]}, headers={"Prefer": "wait=30"}
        )
        assert response.status_code == 200 and response.json()["result"] == {"output": [1.0, 2.0]}, response.text
    finally:
        up.kill()
        up.wait()
    wait_until(lambda: not any(Path(f"/proc/{pid}").exists() for pid in workers), 30, "the API workers to stop")
