"""The API stopped (SIGTERM, as `inferq up` stops it, or Ctrl-C's SIGINT) while clients wait on unfinished jobs: each
is answered at once, as a wait that ran out is, and the process ends."""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis as redis_py

from tests.support.stack import new_stack, serving
from tests.support.waiting import wait_until

pytestmark = pytest.mark.timeout(300)
# Far longer than the test allows the API to stop in: a wait that ran out could not be what answered.
WAIT_S = 600


class Waiting:
    """A client's request on its own thread: its answer once one came, or the error it ended with."""

    def __init__(self, call: Any) -> None:
        self.answer: Any = None
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, args=(call,), daemon=True)
        self.thread.start()

    def _run(self, call: Any) -> None:
        try:
            self.answer = call()
        except BaseException as exc:
            self.error = exc

    def result(self) -> Any:
        self.thread.join(timeout=60)
        assert not self.thread.is_alive(), "no answer"
        assert self.error is None, repr(self.error)
        return self.answer


@contextmanager
def monitored(client: redis_py.Redis) -> Iterator[list[str]]:
    """Every command Redis runs while the block runs (MONITOR), as text, in a list that grows meanwhile."""
    seen: list[str] = []
    stop = threading.Event()

    def watch() -> None:
        with client.monitor() as monitor:
            for command in monitor.listen():
                seen.append(str(command["command"]))
                if stop.is_set():
                    return

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    wait_until(lambda: client.ping() and bool(seen), 10, "MONITOR to start")
    try:
        yield seen
    finally:
        stop.set()
        client.ping()  # a last command, for the watcher to see the stop
        thread.join(timeout=10)


def _sse_events(base: str, job_id: str, heard: threading.Event) -> list[str]:
    """The event names of the job's stream, read until the server ends it."""
    names = []
    with (
        httpx.Client(timeout=httpx.Timeout(10, read=WAIT_S)) as client,
        client.stream("GET", f"{base}/v1/jobs/{job_id}/events") as response,
    ):
        assert response.status_code == 200
        for line in response.iter_lines():
            if line.startswith("event: "):
                names.append(line.removeprefix("event: "))
                heard.set()
    return names


def _ready(base: str) -> bool:
    try:
        return httpx.get(f"{base}/readyz", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


@pytest.mark.parametrize(
    ("stop", "workers"),
    [(signal.SIGTERM, 1), (signal.SIGINT, 1), (signal.SIGTERM, 2)],
    ids=["SIGTERM", "SIGINT", "SIGTERM to --workers 2"],
)
def test_a_stopped_api_answers_every_waiting_request_at_once_and_ends(
    tmp_path: Path, stop: signal.Signals, workers: int
) -> None:
    # No worker: every job stays queued, so only the stop can end a wait.
    with serving(new_stack(tmp_path, INFERQ_MAX_WAIT_S=str(WAIT_S))) as stack, stack.redis() as client:
        api = stack.start("api", "--port", str(stack.port), "--workers", str(workers), name="api")
        wait_until(lambda: _ready(stack.base), 60, "the API")
        jobs = f"{stack.base}/v1/models/slow/jobs"
        streamed, read = (httpx.post(jobs, json={"inputs": [n, n]}, timeout=10).json()["id"] for n in (1, 2))
        heard = threading.Event()
        stream = Waiting(lambda: _sse_events(stack.base, streamed, heard))
        with stack.redis() as watcher, monitored(watcher) as commands:
            reading = Waiting(lambda: httpx.get(f"{stack.base}/v1/jobs/{read}?wait={WAIT_S}", timeout=WAIT_S + 10))
            submit = Waiting(
                lambda: httpx.post(
                    jobs, json={"inputs": [3, 3]}, headers={"Prefer": f"wait={WAIT_S}"}, timeout=WAIT_S + 10
                )
            )
            # Each is waiting: the stream sent its first event, the read looked the job up (after it subscribed to
            # its events), the submit's job is queued (it subscribed before it enqueued).
            wait_until(heard.is_set, 30, "the stream's first event")
            wait_until(lambda: any(read in command for command in commands), 30, "the read to look its job up")
            wait_until(lambda: client.llen("rq:queue:inferq.slow") == 3, 30, "the waited submit's job")
        api.send_signal(stop)
        api.wait(timeout=60)

        submitted = submit.result()
        assert submitted.status_code == 202, submitted.text
        body = submitted.json()
        queued = [job.decode() for job in client.lrange("rq:queue:inferq.slow", 0, -1)]
        assert queued[:2] == [streamed, read] and body["id"] == queued[2]
        assert (body["status"], body["model"]) == ("queued", "slow")  # the 202 of a wait that ran out
        assert submitted.headers["location"] == f"{stack.base}/v1/jobs/{body['id']}"
        assert submitted.headers["preference-applied"] == f"wait={WAIT_S}"
        viewed = reading.result()
        assert viewed.status_code == 200, viewed.text
        assert (viewed.json()["id"], viewed.json()["status"]) == (read, "queued")
        assert stream.result() == ["queued"]  # then the stream ended, cleanly
        log = stack.logs[0].read_text()
        assert " ERROR " not in log and "Traceback" not in log, log
