"""End to end over real HTTP: the API, a batching worker and Redis as separate processes."""

from __future__ import annotations

import json
import threading
import time
from typing import Any

import httpx
import pytest
from rq.serializers import JSONSerializer

from inferq.shared import keys
from inferq.shared.redis_server import free_port
from inferq.shared.rqjson import JSONJob
from tests.support.models import ROOT
from tests.support.stack import Stack
from tests.support.waiting import wait_until


def submit_png(stack: Stack, png: bytes, model: str = "digits", **kwargs: Any) -> httpx.Response:
    return httpx.post(
        f"{stack.base}/v1/models/{model}/jobs",
        files={"file": ("digit.png", png, "image/png")},
        timeout=70,
        **kwargs,
    )


def test_submit_then_poll_returns_the_classification(stack: Stack, digits_heldout: tuple[Any, Any]) -> None:
    pngs, labels = digits_heldout
    response = submit_png(stack, pngs[0])
    assert response.status_code == 202
    body = response.json()
    assert set(body) == {"id", "status", "model", "version", "created_at", "enqueued_at", "urls"}
    assert body["enqueued_at"] == body["created_at"] is not None  # queued as it was created
    assert body["status"] == "queued" and body["model"] == "digits"
    assert response.headers["location"] == f"{stack.base}/v1/jobs/{body['id']}"

    def finished() -> bool:
        return httpx.get(response.headers["location"]).json()["status"] == "finished"

    wait_until(finished, 30, "the job to finish")
    view = httpx.get(response.headers["location"]).json()
    assert view["result"]["label"] == labels[0]
    assert [entry["label"] for entry in view["result"]["top_k"]][0] == labels[0]
    assert len(view["result"]["top_k"]) == 3
    assert view["error"] is None
    assert view["batch_size"] >= 1
    assert view["worker"].startswith("digits.")
    assert view["started_at"] and view["ended_at"] and view["expires_at"]
    assert set(view["timings_ms"]) == {"queue_ms", "inference_ms"}


def test_prefer_wait_answers_200_with_the_finished_job(stack: Stack, digits_heldout: tuple[Any, Any]) -> None:
    pngs, labels = digits_heldout
    response = submit_png(stack, pngs[1], headers={"Prefer": "wait=20"})
    assert response.status_code == 200
    assert response.headers["preference-applied"] == "wait=20"
    assert response.json()["status"] == "finished"
    assert response.json()["result"]["label"] == labels[1]


def test_prefer_wait_falls_back_to_202_when_the_job_is_not_done(stack: Stack) -> None:
    # The slow model has no worker in this stack: the job stays queued.
    response = httpx.post(
        f"{stack.base}/v1/models/slow/jobs",
        json={"inputs": [1, 2]},
        headers={"Prefer": "wait=0.5"},
        timeout=10,
    )
    assert response.status_code == 202
    assert response.json()["status"] == "queued"


def test_get_with_wait_long_polls_until_the_job_ends(stack: Stack, digits_heldout: tuple[Any, Any]) -> None:
    pngs, labels = digits_heldout
    job_id = submit_png(stack, pngs[2]).json()["id"]
    view = httpx.get(f"{stack.base}/v1/jobs/{job_id}", params={"wait": 20}, timeout=30).json()
    assert view["status"] == "finished"
    assert view["result"]["label"] == labels[2]


def test_sse_streams_each_status_change_and_ends_at_the_terminal_one(stack: Stack) -> None:
    job_id = httpx.post(f"{stack.base}/v1/models/slow/jobs", json={"inputs": [1, 2]}).json()["id"]
    events: list[tuple[str, dict[str, Any]]] = []

    def read() -> None:
        with httpx.stream("GET", f"{stack.base}/v1/jobs/{job_id}/events", timeout=60) as response:
            assert response.headers["content-type"].startswith("text/event-stream")
            name = None
            for line in response.iter_lines():
                if line.startswith("event: "):
                    name = line.removeprefix("event: ")
                elif line.startswith("data: ") and name:
                    events.append((name, json.loads(line.removeprefix("data: "))))

    reader = threading.Thread(target=read)
    reader.start()
    wait_until(lambda: len(events) >= 1, 10, "the first event")
    stack.run_burst("slow")
    reader.join(timeout=30)
    assert not reader.is_alive(), "the stream did not end at the terminal status"
    assert [name for name, _ in events] == ["queued", "started", "finished"]
    assert events[-1][1]["result"] == {"output": [1.0, 2.0]}


def test_pubsub_event_arrives_when_the_result_is_already_readable(
    stack: Stack, digits_heldout: tuple[Any, Any]
) -> None:
    client = stack.redis()
    pubsub = client.pubsub()
    pubsub.subscribe(keys.EVENTS_CHANNEL)
    assert pubsub.get_message(timeout=5)["type"] == "subscribe"
    job_id = submit_png(stack, digits_heldout[0][3]).json()["id"]
    seen: list[str] = []
    deadline = time.monotonic() + 30
    while "finished" not in seen and time.monotonic() < deadline:
        message = pubsub.get_message(timeout=1)
        if message and message["type"] == "message":
            event = json.loads(message["data"])
            if event["id"] == job_id:
                seen.append(event["status"])
                if event["status"] == "finished":
                    # Published in the transaction that stored the result: readable right now.
                    job = JSONJob.fetch(job_id, connection=client, serializer=JSONSerializer)
                    assert job.return_value()["label"] == digits_heldout[1][3]
    pubsub.close()
    client.close()
    assert seen == ["started", "finished"]


def test_unknown_job_and_model_are_404_json(stack: Stack) -> None:
    response = httpx.get(f"{stack.base}/v1/jobs/no-such-job")
    assert response.status_code == 404
    assert response.json()["error"]["code"] == "not_found"
    response = httpx.post(f"{stack.base}/v1/models/nope/jobs", files={"file": ("a.png", b"x", "image/png")})
    assert response.status_code == 404
    assert "nope" in response.json()["error"]["message"]


def test_a_webhook_delivery_is_no_job_to_clients(stack: Stack) -> None:
    """A job's delivery is the RQ job ``webhook-<job id>``: no job route reads or cancels it."""
    closed = free_port()  # nothing listens: the delivery fails and is retried later
    accepted = httpx.post(
        f"{stack.base}/v1/models/digits/jobs",
        files={"file": ("digit.png", (ROOT / "samples" / "digit.png").read_bytes(), "image/png")},
        data={"webhook": f"http://127.0.0.1:{closed}/hook"},
        headers={"Prefer": "wait=30"},
        timeout=40,
    )
    assert accepted.status_code in (200, 202), accepted.text
    delivery = f"{keys.DELIVERY_PREFIX}{accepted.json()['id']}"
    client = stack.redis()
    wait_until(lambda: client.exists(f"rq:job:{delivery}"), 30, "the delivery to be queued")
    for method, path in (("GET", delivery), ("POST", f"{delivery}/cancel")):
        response = httpx.request(method, f"{stack.base}/v1/jobs/{path}", timeout=10)
        assert response.status_code == 404, (method, response.text)
        assert response.json()["error"]["code"] == "not_found"


@pytest.mark.parametrize(
    ("kwargs", "status", "fragment"),
    [
        ({"files": {"file": ("a.txt", b"hello, not an image", "text/plain")}}, 415, "not a decodable image"),
        ({"content": b"plain", "headers": {"content-type": "text/plain"}}, 415, "takes an image"),
        ({"files": {"other": ("a.png", b"x", "image/png")}}, 422, "unknown form fields"),
        ({"files": {"webhook": (None, "http://example.test/")}}, 422, "'file' field"),
        ({"data": {"webhook": "x"}}, 415, "takes an image"),
    ],
)
def test_bad_uploads_get_clear_json_errors(stack: Stack, kwargs: dict[str, Any], status: int, fragment: str) -> None:
    response = httpx.post(f"{stack.base}/v1/models/digits/jobs", **kwargs)
    assert response.status_code == status, response.text
    assert fragment in response.json()["error"]["message"]


def test_bad_parameters_are_422(stack: Stack, digits_heldout: tuple[Any, Any]) -> None:
    png = digits_heldout[0][0]
    for data in (
        {"result_ttl": "abc"},
        {"result_ttl": "0"},
        {"result_ttl": "999999999"},
        {"webhook": "ftp://x"},
    ):
        response = httpx.post(
            f"{stack.base}/v1/models/digits/jobs", files={"file": ("a.png", png, "image/png")}, data=data
        )
        assert response.status_code == 422, (data, response.text)
    response = submit_png(stack, png, headers={"Prefer": "wait=1000"})
    assert response.status_code == 422
    assert httpx.get(f"{stack.base}/v1/jobs/whatever", params={"wait": "-1"}).status_code == 422
    response = httpx.post(f"{stack.base}/v1/models/slow/jobs", json={"inputs": [1, 2, 3]})
    assert response.json() == {
        "error": {"code": "invalid_input", "message": "inputs: expected an array of length 2, got length 3"}
    }
    response = httpx.post(
        f"{stack.base}/v1/models/slow/jobs",
        content=b'{"inputs": [NaN, 1]}',
        headers={"content-type": "application/json"},
    )
    assert response.status_code == 422


def test_a_body_over_the_limit_is_413(stack: Stack) -> None:
    response = httpx.post(
        f"{stack.base}/v1/models/digits/jobs",
        content=b"\0" * (10 * 1024 * 1024 + 1),
        headers={"content-type": "image/png"},
        timeout=30,
    )
    assert response.status_code == 413
    assert response.json()["error"]["code"] == "payload_too_large"


def test_held_out_digits_over_http_are_at_least_95_percent_right(stack: Stack, digits_heldout: tuple[Any, Any]) -> None:
    pngs, labels = digits_heldout
    with httpx.Client(base_url=stack.base, timeout=60) as client:
        ids = [
            client.post("/v1/models/digits/jobs", files={"file": ("d.png", png, "image/png")}).json()["id"]
            for png in pngs
        ]
        views = [client.get(f"/v1/jobs/{job_id}", params={"wait": 30}).json() for job_id in ids]
    assert all(view["status"] == "finished" for view in views)
    correct = sum(view["result"]["label"] == label for view, label in zip(views, labels, strict=True))
    assert len(pngs) >= 300
    assert correct / len(pngs) >= 0.95, f"{correct}/{len(pngs)}"
    # Jobs that piled up while the worker was busy ran together.
    assert max(view["batch_size"] for view in views) > 1


def test_models_and_health(stack: Stack) -> None:
    models = httpx.get(f"{stack.base}/v1/models").json()["models"]
    assert [m["name"] for m in models] == ["digits", "digits-batch", "fragile", "slow"]
    digits = httpx.get(f"{stack.base}/v1/models/digits").json()
    assert digits["labels"] == [str(i) for i in range(10)]
    assert digits["max_batch"] == 256 and digits["input"]["size"] == [8, 8]
    assert digits["queue"] == "inferq.digits" and isinstance(digits["queue_length"], int)
    assert digits["workers"] == 1
    assert httpx.get(f"{stack.base}/healthz").json() == {"status": "ok", "durability": "async"}
    # The module's stack runs one worker, for digits; the other models' jobs would wait.
    assert httpx.get(f"{stack.base}/readyz").json() == {
        "status": "degraded",
        "workers": {"digits": 1, "digits-batch": 0, "fragile": 0, "slow": 0},
        "models_without_workers": ["digits-batch", "fragile", "slow"],
        "invalid_models": [],
        "durability": "async",
        "replicas": None,
        "unavailable": {},
    }
    schema = httpx.get(f"{stack.base}/openapi.json").json()
    # One submit path per model, each with that model's request body.
    assert {f"/v1/models/{name}/jobs" for name in ("digits", "digits-batch", "fragile", "slow")} <= set(schema["paths"])
