"""End to end: webhooks, cancel, batching, per-item failure, rq info, the CLI, and what stays in Redis."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from rq.serializers import JSONSerializer

from inferq.shared import signing
from inferq.shared.redis_server import free_port
from inferq.shared.rqjson import JSONJob
from tests.support.echo import POISON
from tests.support.stack import Stack
from tests.support.waiting import wait_until
from tests.support.webhooks import WEBHOOK_SECRET, Receiver


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    running = Receiver()
    yield running
    running.close()


def view(stack: Stack, job_id: str, wait: float = 0) -> dict[str, Any]:
    params = {"wait": wait} if wait else {}
    return httpx.get(f"{stack.base}/v1/jobs/{job_id}", params=params, timeout=wait + 10).json()


def submit_tensor(stack: Stack, values: list[float], **extra: Any) -> str:
    response = httpx.post(f"{stack.base}/v1/models/slow/jobs", json={"inputs": values, **extra})
    assert response.status_code == 202, response.text
    return str(response.json()["id"])


def test_webhook_is_signed_retried_after_a_500_and_recorded(
    stack: Stack, receiver: Receiver, digits_heldout: tuple[Any, Any]
) -> None:
    response = httpx.post(
        f"{stack.base}/v1/models/digits/jobs",
        files={"file": ("d.png", digits_heldout[0][5], "image/png")},
        data={"webhook": receiver.url},
    )
    job_id = response.json()["id"]
    wait_until(lambda: len(receiver.deliveries) >= 2, 30, "a retried webhook delivery")
    first, second = receiver.deliveries[:2]
    for delivery in (first, second):
        assert signing.verify(WEBHOOK_SECRET, delivery["headers"], delivery["body"])
        assert delivery["headers"]["webhook-id"] == f"msg_{job_id}"
    assert not signing.verify(WEBHOOK_SECRET, first["headers"], first["body"] + b" ")
    body = json.loads(second["body"])
    assert body["id"] == job_id and body["status"] == "finished"
    assert body["result"]["label"] == digits_heldout[1][5]

    def recorded() -> bool:
        return [a.get("outcome") for a in view(stack, job_id)["webhook"]["attempts"]] == ["retrying", "delivered"]

    wait_until(recorded, 10, "both attempts on the job view")
    attempts = view(stack, job_id)["webhook"]["attempts"]
    assert [a["status_code"] for a in attempts] == [500, 204]
    assert [a["response_bytes"] for a in attempts] == [0, 0]  # the receiver answers with no body
    assert view(stack, job_id)["webhook"]["url"] == receiver.url


@pytest.mark.parametrize(
    ("statuses", "codes", "outcomes"),
    [
        ([404], [404], ["gave up"]),  # a 4xx other than 408/429 is final
        ([302], [302], ["gave up"]),  # redirects are not followed
        ([429, 200], [429, 200], ["retrying", "delivered"]),  # Retry-After: 0 is honoured
    ],
)
def test_webhook_retry_policy(stack: Stack, statuses: list[int], codes: list[int], outcomes: list[str]) -> None:
    receiver = Receiver(statuses)
    try:
        job_id = submit_tensor(stack, [1, 2], webhook=receiver.url)
        stack.run_burst("slow")

        def settled() -> bool:
            attempts = view(stack, job_id)["webhook"]["attempts"]
            return len(attempts) == len(outcomes) and attempts[-1]["outcome"] != "retrying"

        wait_until(settled, 20, "the delivery to settle")
        time.sleep(1.5)  # nothing more may arrive
        attempts = view(stack, job_id)["webhook"]["attempts"]
        assert [a["status_code"] for a in attempts] == codes
        assert [a["outcome"] for a in attempts] == outcomes
        assert len(receiver.deliveries) == len(codes)
    finally:
        receiver.close()


def test_a_receiver_that_is_down_gets_the_webhook_once_it_is_back(stack: Stack) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}/hook"
    job_id = submit_tensor(stack, [5, 6], webhook=url)
    stack.run_burst("slow")
    wait_until(lambda: len(view(stack, job_id)["webhook"]["attempts"]) >= 2, 20, "failed attempts")
    receiver = Receiver(statuses=[200], port=port)
    try:
        wait_until(lambda: len(receiver.deliveries) == 1, 20, "the delivery once the receiver is up")
        attempts = view(stack, job_id)["webhook"]["attempts"]
        assert all("ConnectError" in a["error"] and a["outcome"] == "retrying" for a in attempts[:-1])
        wait_until(lambda: view(stack, job_id)["webhook"]["attempts"][-1]["outcome"] == "delivered", 10, "record")
        assert json.loads(receiver.deliveries[0]["body"])["result"] == {"output": [5.0, 6.0]}
    finally:
        receiver.close()


def test_one_pubsub_subscriber_serves_every_waiting_request(stack: Stack) -> None:
    ids = [submit_tensor(stack, [i, i]) for i in range(6)]
    with httpx.Client(base_url=stack.base, timeout=30) as client:
        results: list[dict[str, Any]] = []
        threads = [
            threading.Thread(target=lambda i=i: results.append(client.get(f"/v1/jobs/{i}", params={"wait": 20}).json()))
            for i in ids
        ]
        for thread in threads:
            thread.start()
        time.sleep(1.0)
        redis = stack.redis()
        assert redis.pubsub_numsub("inferq:events") == [(b"inferq:events", 1)]
        redis.close()
        stack.run_burst("slow")
        for thread in threads:
            thread.join(timeout=30)
    assert sorted(r["result"]["output"][0] for r in results) == [float(i) for i in range(6)]


def test_cancel_a_queued_job_and_it_never_runs(stack: Stack) -> None:
    job_id = submit_tensor(stack, [1, 2])
    response = httpx.post(f"{stack.base}/v1/jobs/{job_id}/cancel")
    assert response.status_code == 200
    assert response.json()["status"] == "canceled"
    stack.run_burst("slow")
    after = view(stack, job_id)
    assert after["status"] == "canceled" and after["result"] is None and after["started_at"] is None
    client = stack.redis()
    assert client.ttl(JSONJob.key_for(job_id)) > 0  # RQ alone would keep a canceled job forever
    client.close()
    again = httpx.post(f"{stack.base}/v1/jobs/{job_id}/cancel")
    assert again.status_code == 409


def test_cancel_a_finished_job_is_409_and_it_stays_finished(stack: Stack, digits_heldout: tuple[Any, Any]) -> None:
    response = httpx.post(
        f"{stack.base}/v1/models/digits/jobs",
        files={"file": ("d.png", digits_heldout[0][0], "image/png")},
        headers={"Prefer": "wait=20"},
        timeout=30,
    )
    job_id = response.json()["id"]
    assert response.json()["status"] == "finished"
    cancel = httpx.post(f"{stack.base}/v1/jobs/{job_id}/cancel")
    assert cancel.status_code == 409
    assert cancel.json()["error"]["code"] == "conflict"
    assert view(stack, job_id)["status"] == "finished"
    assert view(stack, job_id)["result"]["label"] == digits_heldout[1][0]


def test_cancel_a_started_job_discards_its_result(stack: Stack) -> None:
    job_id = submit_tensor(stack, [3, 4])
    worker = stack.start_worker("slow", extra=["--burst"], name="slow-burst")
    wait_until(lambda: view(stack, job_id)["status"] == "started", 30, "the job to start")
    response = httpx.post(f"{stack.base}/v1/jobs/{job_id}/cancel")
    assert response.status_code == 200 and response.json()["status"] == "canceled"
    worker.wait(timeout=30)
    after = view(stack, job_id)
    assert after["status"] == "canceled" and after["result"] is None
    client = stack.redis()
    assert JSONJob.fetch(job_id, connection=client, serializer=JSONSerializer).latest_result() is None
    client.close()


def test_waiting_jobs_run_as_one_batch_and_a_corrupt_image_fails_alone(
    stack: Stack, digits_heldout: tuple[Any, Any]
) -> None:
    pngs, labels = digits_heldout
    good = list(range(7))
    ids = [
        httpx.post(f"{stack.base}/v1/models/digits-batch/jobs", files={"file": ("d.png", pngs[i], "image/png")}).json()[
            "id"
        ]
        for i in good
    ]
    truncated = pngs[7][: len(pngs[7]) // 2]  # a valid header, a broken body: only the worker can tell
    bad = httpx.post(f"{stack.base}/v1/models/digits-batch/jobs", files={"file": ("d.png", truncated, "image/png")})
    assert bad.status_code == 202
    stack.run_burst("digits-batch")
    views = [view(stack, job_id) for job_id in ids]
    assert [v["status"] for v in views] == ["finished"] * len(good)
    assert [v["result"]["label"] for v in views] == [labels[i] for i in good]
    assert [v["batch_size"] for v in views] == [len(good) + 1] * len(good)
    failed = view(stack, bad.json()["id"])
    assert failed["status"] == "failed"
    assert failed["batch_size"] == len(good) + 1
    assert "could not decode image" in failed["error"]
    assert failed["result"] is None


def test_a_batch_that_breaks_the_model_fails_only_the_guilty_item(stack: Stack) -> None:
    ids = [submit_tensor(stack, [i, i + 1]) for i in range(5)]
    poison = submit_tensor(stack, [POISON, 0])
    stack.run_burst("slow", extra=["--max-batch", "8"])
    assert [view(stack, i)["result"] for i in ids] == [{"output": [float(i), float(i + 1)]} for i in range(5)]
    failed = view(stack, poison)
    assert failed["status"] == "failed"
    assert "poison value" in failed["error"]


def test_rq_info_shows_queues_and_workers_and_corrupts_nothing(stack: Stack, digits_heldout: tuple[Any, Any]) -> None:
    job_id = httpx.post(
        f"{stack.base}/v1/models/digits/jobs",
        files={"file": ("d.png", digits_heldout[0][9], "image/png")},
        headers={"Prefer": "wait=20"},
        timeout=30,
    ).json()["id"]
    rq = str(Path(sys.executable).parent / "rq")  # the venv running the tests, wherever its checkout is
    out = subprocess.run([rq, "info", "-u", stack.redis_url], capture_output=True, text=True, timeout=60, check=True)
    assert "inferq.digits" in out.stdout
    assert "inferq.webhooks" in out.stdout
    assert "digits." in out.stdout  # the batching worker, by name
    assert "idle" in out.stdout or "busy" in out.stdout
    client = stack.redis()
    job = JSONJob.fetch(job_id, connection=client, serializer=JSONSerializer)
    assert job.return_value()["label"] == digits_heldout[1][9]
    client.close()
    assert view(stack, job_id)["status"] == "finished"


def test_cli_submit_and_models_talk_to_the_api(stack: Stack, digits_heldout: tuple[Any, Any], tmp_path: Any) -> None:
    png = tmp_path / "seven.png"
    png.write_bytes(digits_heldout[0][0])
    cli = [sys.executable, "-m", "inferq"]
    out = subprocess.run(
        [*cli, "submit", "digits", str(png), "--wait", "20", "--api", stack.base],
        capture_output=True,
        text=True,
        timeout=60,
        env=stack.env,
    )
    assert out.returncode == 0, out.stderr
    line = json.loads(out.stdout.strip().splitlines()[-1])
    assert line["status"] == "finished" and line["result"]["label"] == digits_heldout[1][0]
    out = subprocess.run([*cli, "models", "--api", stack.base], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "digits" in out.stdout and "max_batch=256" in out.stdout


def test_every_key_has_a_ttl_and_no_pickle_is_left(stack: Stack) -> None:
    # Runs after the tests above in this module: finished, failed, canceled and webhook jobs exist.
    time.sleep(1.5)  # let webhook deliveries settle
    client = stack.redis()
    no_ttl = []
    for key in client.scan_iter(count=1000):
        name = key.decode()
        if _structural(name):
            continue
        if client.ttl(key) < 0:
            no_ttl.append(name)
        assert not _holds_pickle(client, key), f"{name} holds a pickle"
    client.close()
    assert no_ttl == []


# RQ's own bookkeeping: queue lists, registries, worker sets and hashes. Their members are
# cleaned by RQ's maintenance; only job, result, execution and inferq keys carry data.
_STRUCTURAL_PREFIXES = (
    "rq:queue:",
    "rq:queues",
    "rq:finished:",
    "rq:failed:",
    "rq:canceled:",
    "rq:wip:",
    "rq:scheduled:",
    "rq:deferred:",
    "rq:workers",
    "rq:worker:",
    "rq:scheduler",
    "rq:clean_registries:",
    "rq:intermediate",
)


def _structural(name: str) -> bool:
    return name.startswith(_STRUCTURAL_PREFIXES)


def _holds_pickle(client: Any, key: bytes) -> bool:
    kind = client.type(key).decode()
    values: list[bytes] = []
    if kind == "string":
        values = [client.get(key)]
    elif kind == "hash":
        values = list(client.hgetall(key).values())
    elif kind == "list":
        values = client.lrange(key, 0, -1)
    elif kind == "stream":
        values = [v for _, fields in client.xrange(key) for v in fields.values()]
    # Every pickle protocol >= 2 starts with PROTO (0x80).
    return any(value.startswith(b"\x80") for value in values if value)
