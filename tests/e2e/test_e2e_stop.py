"""`inferq up` stopped as a terminal stops it, killed outright, and started again on the same data."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis as redis_py
from rq.scheduler import SCHEDULER_KEY_TEMPLATE

from inferq.leftovers import process_alive
from inferq.shared.redis_server import RedisServer, free_port
from tests.support.models import ROOT
from tests.support.waiting import wait_until

pytestmark = pytest.mark.timeout(300)
SLOW_MODEL = {
    "handler": "tests.support.echo:SlowEcho",
    "weights": "none",
    "input": {"kind": "tensor", "shape": [2], "dtype": "float32"},
    "max_batch": 8,
}


class Up:
    """One `inferq up` in its own process group, as a shell runs a foreground job."""

    def __init__(self, tmp: Path, **env: str) -> None:
        models = tmp / "models"
        (models / "slow").mkdir(parents=True, exist_ok=True)
        (models / "slow" / "config.json").write_text(json.dumps(SLOW_MODEL))
        self.tmp = tmp
        self.port = free_port()
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("INFERQ_")} | {
            "INFERQ_PORT": str(self.port),
            "INFERQ_DATA_DIR": str(tmp / "state"),
            "INFERQ_MODELS_DIR": str(models),
            "PYTHONPATH": str(ROOT),
            **env,
        }
        self.runs = 0
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def log_path(self) -> Path:
        return self.tmp / f"up.{self.runs}.log"

    def start(self) -> None:
        self.runs += 1
        with self.log_path.open("wb") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "inferq", "up"],
                cwd=ROOT,
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        # This run's own worker has registered (a stale registration would answer readyz too).
        wait_until(lambda: "Listening on inferq.slow" in self.log(), 90, "this run's worker")
        wait_until(lambda: self.workers() is not None, 30, "the API")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def redis_url(self) -> str:
        found = re.search(r"Redis:\s+(redis://127\.0\.0\.1:\d+/0)", self.log())
        assert found, self.log()
        return found.group(1)

    def workers(self) -> dict[str, int] | None:
        try:
            response = httpx.get(f"{self.base}/readyz", timeout=2)
        except httpx.HTTPError:
            return None
        return response.json()["workers"] if response.status_code == 200 else None

    def ctrl_c(self) -> int:
        """SIGINT to the whole foreground process group, as the terminal sends it; the exit status."""
        assert self.proc is not None
        os.killpg(self.proc.pid, signal.SIGINT)
        return self.proc.wait(timeout=120)

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@pytest.fixture
def up(tmp_path: Path) -> Any:
    running = Up(tmp_path, INFERQ_TEST_SLOW_S="3")
    try:
        yield running
    except BaseException:
        print(running.log())
        raise
    finally:
        running.close()


def _view(up: Up, job_id: str) -> dict[str, Any]:
    response = httpx.get(f"{up.base}/v1/jobs/{job_id}", timeout=5)
    assert response.status_code == 200, response.text
    view: dict[str, Any] = response.json()
    return view


def test_ctrl_c_lets_the_running_batch_finish_and_stops_redis_last(up: Up) -> None:
    up.start()
    redis_url = up.redis_url()
    response = httpx.post(f"{up.base}/v1/models/slow/jobs", json={"inputs": [1, 2]}, timeout=10)
    assert response.status_code == 202, response.text
    job_id = response.json()["id"]
    wait_until(lambda: _view(up, job_id)["status"] == "started", 30, "the batch to start")
    started_at = _view(up, job_id)["started_at"]

    assert up.ctrl_c() == 0
    first = up.log()
    assert "Traceback" not in first, first
    assert "cannot store" not in first and "could not connect to Redis" not in first, first
    assert "inferq stopped." in first
    # What the stop left in Redis's data: no worker listed, no scheduler lock held.
    with (
        RedisServer(up.tmp / "state" / "redis", stable_port=True) as server,
        redis_py.Redis.from_url(server.url) as client,
    ):
        assert client.smembers("rq:workers") == set()
        assert client.keys("rq:scheduler-lock:*") == []

    # Started again on the same data: the same Redis URL, and the job ended once, with its result.
    up.start()
    assert up.redis_url() == redis_url
    # The clean stop unregistered its workers and released the scheduler's lock: nothing to clear.
    assert "cleared what a run that did not stop left in Redis" not in up.log()
    view = _view(up, job_id)
    assert view["status"] == "finished", view
    assert view["result"] == {"output": [1.0, 2.0]}
    assert view["started_at"] == started_at  # it did not run again
    # The worker of the first run unregistered when it stopped: only this run's is listed.
    assert up.workers() == {"slow": 1}
    # The printed command works as pasted.
    (command,) = re.findall(r"queues:\s+(.+)", up.log())
    assert command.endswith(f"info -u {redis_url}")
    done = subprocess.run(command, shell=True, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "inferq.slow" in done.stdout
    assert up.ctrl_c() == 0
    assert "Traceback" not in up.log()


def _descendants(root: int) -> list[int]:
    out = subprocess.run(["ps", "-eo", "pid,ppid"], capture_output=True, text=True, check=True).stdout
    children: dict[int, list[int]] = {}
    for line in out.splitlines()[1:]:
        pid, ppid = (int(n) for n in line.split())
        children.setdefault(ppid, []).append(pid)
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo += children.get(pid, [])
    return found


def _scheduler_pid(client: redis_py.Redis, lock: str) -> int:
    """The PID of the scheduler holding ``lock`` once it has registered; 0 before."""
    owner = client.get(lock)
    if owner is None:
        return 0
    return int(client.hget(SCHEDULER_KEY_TEMPLATE % owner.decode(), "pid") or 0)  # type: ignore[union-attr]


def test_a_killed_stack_leaves_no_workers_or_scheduler_lock_behind_at_the_next_start(up: Up) -> None:
    up.start()
    client = redis_py.Redis.from_url(up.redis_url())
    lock = "rq:scheduler-lock:inferq.webhooks"
    # The sender takes the lock before it forks its scheduler, which then registers itself: killed in between, the
    # stack would leave a lock no hash explains (or a scheduler forked after the list of processes below).
    wait_until(lambda: _scheduler_pid(client, lock), 30, "the webhook scheduler to take its lock and register")
    old_lock = client.get(lock)
    scheduler_pid = _scheduler_pid(client, lock)
    client.close()
    # As a power cut or an OOM kill would: every process of the stack stops at once, nothing unregisters.
    assert up.proc is not None
    pids = _descendants(up.proc.pid)
    assert scheduler_pid in pids
    assert len(pids) >= 5  # supervisor, redis, api, worker, webhooks (+ its scheduler)
    for sig in (signal.SIGSTOP, signal.SIGKILL):
        for pid in pids:
            os.kill(pid, sig)
    up.proc.wait()

    up.start()
    client = redis_py.Redis.from_url(up.redis_url())
    try:
        assert up.workers() == {"slow": 1}
        for key in client.smembers("rq:workers"):
            assert process_alive(int(client.hget(key, "pid") or 0), None), key
        # The new sender's scheduler holds the lock now, not the dead one (whose lock lasted a minute).
        wait_until(lambda: client.get(lock) not in (None, old_lock), 30, "the new scheduler to take the lock")
        assert process_alive(_scheduler_pid(client, lock), None)
    finally:
        client.close()
    assert "cleared what a run that did not stop left in Redis: workers slow." in up.log()
    assert up.ctrl_c() == 0


def test_ctrl_c_answers_a_client_waiting_on_a_job_the_stop_leaves_queued(up: Up) -> None:
    """The workers stop first, so a job queued behind the running batch stays queued; the API, stopped next, answers
    its waiting client the 202 with the job's ID at once (it held the stop until the supervisor killed it, and the
    client got no answer at all)."""
    up.start()
    url = f"{up.base}/v1/models/slow/jobs"
    running = httpx.post(url, json={"inputs": [1, 2]}, timeout=10).json()["id"]
    wait_until(lambda: _view(up, running)["status"] == "started", 30, "the batch to start")
    answers: list[httpx.Response] = []
    waiting = threading.Thread(
        target=lambda: answers.append(
            httpx.post(url, json={"inputs": [3, 4]}, headers={"Prefer": "wait=60"}, timeout=120)
        ),
        daemon=True,
    )
    waiting.start()
    client = redis_py.Redis.from_url(up.redis_url())
    try:
        wait_until(lambda: client.llen("rq:queue:inferq.slow") == 1, 30, "the waited job, queued behind the batch")
        (queued,) = (job.decode() for job in client.lrange("rq:queue:inferq.slow", 0, -1))
    finally:
        client.close()

    assert up.ctrl_c() == 0
    waiting.join(timeout=30)
    (answer,) = answers
    assert answer.status_code == 202, answer.text
    assert (answer.json()["id"], answer.json()["status"]) == (queued, "queued")
    log = up.log()
    assert " ERROR " not in log and "Traceback" not in log, log
    assert "closing open requests" not in log, log  # no hurry was needed (the second SIGTERM)
    assert "inferq stopped." in log
