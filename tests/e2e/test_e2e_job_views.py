"""One job, one view: every way a client is shown a finished job sends the same bytes.

GET /v1/jobs/{id} answered with FastAPI's encoding of the JobView model ("webhook": null, 0.000015), while the
answer of a Prefer: wait submit and the SSE events were the view as a dict through json.dumps (no "webhook",
1.5e-05), the webhook body json.dumps's compact ASCII, and each read's expires_at was the moment of the read plus
what was left of the TTL, which moved by a millisecond from read to read.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import pytest
import redis as redis_py

from inferq.shared import keys
from inferq.shared.redis_server import free_port
from tests.support.stack import Stack, new_stack, serving
from tests.support.waiting import wait_until

# float32 values whose shortest repr the two encoders printed apart (1.5e-05 in float32 is 1.4999999621068127e-05).
INPUTS = [1.5e-05, 2.0]
KNOWN = ("id", "model", "version", "created_at")


@pytest.fixture(scope="module")
def views(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with serving(new_stack(tmp_path_factory.mktemp("views"), INFERQ_TEST_SLOW_S="0")) as stack:
        stack.start_api()
        stack.start_worker("slow", "fragile")
        stack.start("webhooks", name="webhooks")
        stack.wait_for_worker("slow")
        stack.wait_for_worker("fragile")
        yield stack


def _read(stack: Stack, job_id: str, **params: Any) -> bytes:
    answer = httpx.get(f"{stack.base}/v1/jobs/{job_id}", params=params, timeout=30)
    assert answer.status_code == 200, answer.text
    return answer.content


def _finished_event_data(stack: Stack, job_id: str) -> bytes:
    """The data line of the stream's last event (the job ended already: its one event is the end)."""
    events = []
    with httpx.stream("GET", f"{stack.base}/v1/jobs/{job_id}/events", timeout=30) as stream:
        for line in stream.iter_lines():
            if line.startswith("event: "):
                events.append(line.removeprefix("event: "))
            elif line.startswith("data: "):
                data = line.removeprefix("data: ").encode()
    assert events[-1] in ("finished", "failed"), events
    return data


@pytest.mark.parametrize(("model", "status"), [("slow", "finished"), ("fragile", "failed")])
def test_a_waited_job_reads_the_same_bytes_on_every_path(views: Stack, model: str, status: str) -> None:
    values = INPUTS if status == "finished" else [666.0, 666.0]  # the poison value fails the job
    subscriber = views.redis().pubsub()
    subscriber.subscribe(keys.EVENTS_CHANNEL)
    try:
        waited = httpx.post(
            f"{views.base}/v1/models/{model}/jobs", json={"inputs": values}, headers={"Prefer": "wait=60"}, timeout=70
        )
        assert waited.status_code == 200, waited.text
        job_id = waited.json()["id"]
        published = _end_event(subscriber, job_id)
    finally:
        subscriber.close()
    body = waited.content
    assert _read(views, job_id) == body
    assert _read(views, job_id, wait=5) == body
    assert _finished_event_data(views, job_id) == body
    assert (json.loads(body)["status"], json.loads(body)["webhook"]) == (status, None)
    # The end event carries the view but for what the waiting request knew already, encoded alike.
    shown = {k: v for k, v in json.loads(body).items() if k not in (*KNOWN, "webhook")}
    assert json.loads(published)["view"] == shown
    if status == "finished":
        # One number, printed alike in both (json.dumps wrote 1.4999999621068127e-05).
        assert b"0.000014999999621068127" in body and b"0.000014999999621068127" in published


def _end_event(subscriber: redis_py.client.PubSub, job_id: str) -> bytes:
    """The raw end event of ``job_id`` as the channel carried it."""
    ended: list[bytes] = []

    def heard() -> bool:
        message = subscriber.get_message(timeout=1.0)
        if message is not None and message["type"] == "message":
            event = json.loads(message["data"])
            if event["id"] == job_id and event["status"] in ("finished", "failed"):
                ended.append(message["data"])
        return bool(ended)

    wait_until(heard, 60, f"the end event of {job_id}")
    return ended[0]


class _ReadingReceiver:
    """A webhook receiver that reads the job's view from the API while it holds the delivery (before the sender
    records the attempt), and keeps both."""

    def __init__(self, api: str) -> None:
        self.got: list[tuple[bytes, bytes]] = []
        self.port = free_port()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["content-length"]))
                job_id = self.headers["webhook-id"].removeprefix("msg_")
                read = httpx.get(f"{api}/v1/jobs/{job_id}", timeout=30).content
                receiver.got.append((body, read))
                self.send_response(204)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_the_webhook_body_is_the_job_as_get_shows_it(views: Stack) -> None:
    receiver = _ReadingReceiver(views.base)
    try:
        url = f"http://127.0.0.1:{receiver.port}/hook"
        submitted = httpx.post(f"{views.base}/v1/models/slow/jobs", json={"inputs": INPUTS, "webhook": url}, timeout=30)
        assert submitted.status_code == 202, submitted.text
        wait_until(lambda: receiver.got, 60, "the webhook delivery")
    finally:
        receiver.close()
    body, read = receiver.got[0]
    assert body == read
    view = json.loads(body)
    assert (view["id"], view["status"], view["webhook"]) == (
        submitted.json()["id"],
        "finished",
        {"url": url, "attempts": []},
    )
    assert b"0.000014999999621068127" in body
