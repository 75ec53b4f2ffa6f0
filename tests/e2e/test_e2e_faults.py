"""Faults injected into real worker processes: kill -9 mid-batch, warm and cold shutdown."""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from inferq.shared.redis_server import RedisServer
from tests.support.stack import Stack, new_stack, serving
from tests.support.waiting import wait_until

SLOW = {"INFERQ_TEST_SLOW_S": "4"}


@pytest.fixture(scope="module")
def faults(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """An API and Redis only: each test starts and breaks its own workers."""
    with serving(new_stack(tmp_path_factory.mktemp("faults"))) as running:
        running.start_api()
        yield running


@pytest.fixture(autouse=True)
def _stop_workers(faults: Stack) -> Iterator[None]:
    """Each test's workers end with it, so the next test's jobs wait for its own."""
    api, api_log = faults.procs[:1], faults.logs[:1]
    yield
    for proc in faults.procs[1:]:
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
    faults.procs[:], faults.logs[:] = api, api_log
    client = faults.redis()
    for key in client.keys("rq:worker:*"):
        client.delete(key)  # the killed workers' registrations
    client.srem("rq:workers", *client.smembers("rq:workers") or [b"-"])
    client.close()


def submit(stack: Stack, model: str, count: int) -> list[str]:
    ids = []
    for i in range(count):
        response = httpx.post(f"{stack.base}/v1/models/{model}/jobs", json={"inputs": [i, i]})
        assert response.status_code == 202, response.text
        ids.append(response.json()["id"])
    return ids


def views(stack: Stack, ids: list[str]) -> list[dict[str, Any]]:
    return [httpx.get(f"{stack.base}/v1/jobs/{job_id}").json() for job_id in ids]


def statuses(stack: Stack, ids: list[str]) -> list[str]:
    return [view["status"] for view in views(stack, ids)]


def test_kill_9_mid_batch_loses_nothing_and_retries_within_a_minute(faults: Stack) -> None:
    ids = submit(faults, "slow", 3)
    doomed = faults.start_worker("slow", name="doomed", env=SLOW)
    wait_until(lambda: statuses(faults, ids) == ["started"] * 3, 30, "the batch to start")
    doomed.send_signal(signal.SIGKILL)
    doomed.wait()
    killed_at = time.monotonic()
    faults.start_worker("slow", name="survivor")
    wait_until(lambda: statuses(faults, ids) == ["finished"] * 3, 75, "the retried jobs to finish")
    assert time.monotonic() - killed_at < 60
    assert [view["result"] for view in views(faults, ids)] == [{"output": [float(i), float(i)]} for i in range(3)]


def test_kill_9_with_no_retries_left_fails_with_a_reason(faults: Stack) -> None:
    (job_id,) = submit(faults, "fragile", 1)
    doomed = faults.start_worker("fragile", name="doomed-fragile", env=SLOW)
    wait_until(lambda: statuses(faults, [job_id]) == ["started"], 30, "the job to start")
    doomed.send_signal(signal.SIGKILL)
    doomed.wait()
    faults.start_worker("fragile", name="cleaner")
    wait_until(lambda: statuses(faults, [job_id]) == ["failed"], 75, "the job to be marked failed")
    (view,) = views(faults, [job_id])
    assert "worker running this job died" in view["error"]


def test_first_sigterm_finishes_the_batch_then_exits(faults: Stack) -> None:
    ids = submit(faults, "slow", 2)
    worker = faults.start_worker("slow", name="warm", env=SLOW)
    wait_until(lambda: statuses(faults, ids) == ["started"] * 2, 30, "the batch to start")
    worker.send_signal(signal.SIGTERM)
    assert worker.wait(timeout=30) == 0
    assert statuses(faults, ids) == ["finished"] * 2


def test_second_sigterm_gives_the_batch_back_at_once(faults: Stack, tmp_path: Path) -> None:
    ids = submit(faults, "slow", 3)
    worker = faults.start_worker("slow", name="cold", env={"INFERQ_TEST_SLOW_S": "30"})
    wait_until(lambda: statuses(faults, ids) == ["started"] * 3, 30, "the batch to start")
    worker.send_signal(signal.SIGTERM)
    time.sleep(1.2)  # RQ ignores a second signal within a second of the first
    worker.send_signal(signal.SIGTERM)
    worker.wait(timeout=15)
    assert statuses(faults, ids) == ["queued"] * 3
    client = faults.redis()
    assert client.lrange("rq:queue:inferq.slow", 0, -1) == [i.encode() for i in ids]
    assert client.zcard("rq:wip:inferq.slow") == 0
    client.close()
    faults.run_burst("slow")
    assert statuses(faults, ids) == ["finished"] * 3


def test_redis_restart_under_load_answers_503_then_recovers_and_loses_no_accepted_job(
    tmp_path: Path,
) -> None:
    stack = new_stack(tmp_path, appendonly=True)
    accepted: list[str] = []
    unavailable: list[httpx.Response] = []
    other: list[int] = []
    done = threading.Event()

    def load() -> None:
        with httpx.Client(base_url=stack.base, timeout=10) as client:
            for i in range(2000):
                if done.is_set():
                    return
                try:
                    response = client.post("/v1/models/slow/jobs", json={"inputs": [i, i]})
                except httpx.HTTPError:
                    other.append(-1)
                    continue
                if response.status_code == 202:
                    accepted.append(response.json()["id"])
                elif response.status_code == 503:
                    unavailable.append(response)
                else:
                    other.append(response.status_code)
                time.sleep(0.01)

    try:
        stack.start_api()
        stack.start_worker("slow")
        stack.wait_for_worker("slow")
        loader = threading.Thread(target=load)
        loader.start()
        wait_until(lambda: len(accepted) >= 20, 20, "load to flow")
        port = stack.redis_server.port
        stack.redis_server.stop()  # SHUTDOWN: the AOF holds every acknowledged write
        wait_until(lambda: len(unavailable) >= 3, 20, "503s while Redis is down")
        stack.redis_server = RedisServer(tmp_path / "redis", port=port, appendonly=True)
        stack.redis_server.start()
        before = len(accepted)
        wait_until(lambda: len(accepted) >= before + 20, 30, "submissions to succeed again")
        done.set()
        loader.join(timeout=30)
        wait_until(lambda: statuses(stack, accepted).count("finished") == len(accepted), 60, "every accepted job")
    except BaseException:
        print(stack.log_text())
        raise
    finally:
        done.set()
        stack.stop_all()
        stack.redis_server.stop()
    assert other == []
    for response in unavailable:
        assert response.headers["retry-after"] == "1"
        assert response.json()["error"]["code"] == "unavailable"
    assert len(set(accepted)) == len(accepted) > 40


def test_first_sigterm_while_a_batch_is_collected_runs_it_then_exits(faults: Stack) -> None:
    (job_id,) = submit(faults, "slow", 1)
    client = faults.redis()
    # A long fill wait: the worker holds the popped job, still IDLE in RQ's eyes, when the signal comes.
    worker = faults.start_worker("slow", extra=["--max-wait-ms", "20000"], name="collecting")
    wait_until(lambda: client.lrange("rq:queue:inferq.slow:intermediate", 0, -1) == [job_id.encode()], 30, "the pop")
    worker.send_signal(signal.SIGTERM)
    assert worker.wait(timeout=30) == 0
    assert statuses(faults, [job_id]) == ["finished"]
    assert client.llen("rq:queue:inferq.slow:intermediate") == 0
    client.close()


def test_second_sigterm_while_a_batch_is_collected_gives_it_back(faults: Stack) -> None:
    ids = submit(faults, "slow", 2)
    client = faults.redis()
    worker = faults.start_worker("slow", extra=["--max-wait-ms", "20000", "--max-batch", "4"], name="cold-collect")
    wait_until(lambda: client.llen("rq:queue:inferq.slow:intermediate") == 2, 30, "the pops")
    worker.send_signal(signal.SIGINT)  # like SIGTERM for RQ; both are graceful first, then cold
    time.sleep(1.2)  # RQ ignores a second signal within a second of the first
    worker.send_signal(signal.SIGINT)
    worker.wait(timeout=15)
    assert client.lrange("rq:queue:inferq.slow", 0, -1) + client.lrange("rq:queue:inferq.slow:intermediate", 0, -1) in (
        [i.encode() for i in ids],
        [],  # the first signal already ended the wait and ran the batch before the second came
    )
    client.close()
    faults.run_burst("slow")
    assert statuses(faults, ids) == ["finished"] * 2
