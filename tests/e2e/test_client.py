"""The Python SDK (inferq.client) against the real API, worker, webhook sender and Redis, over real HTTP."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
import standardwebhooks

from inferq.client import (
    AsyncClient,
    Batch,
    BatchResult,
    Client,
    Conflict,
    InvalidInput,
    Job,
    JobFailed,
    NotFound,
    QueueFull,
    Retry,
    TransportError,
    UnsupportedMedia,
    WaitTimeout,
    WebhookVerificationError,
    verify_webhook,
)
from tests.support.models import ROOT
from tests.support.stack import Stack, new_stack, serving
from tests.support.waiting import wait_until
from tests.support.webhooks import WEBHOOK_SECRET

QUICK = Retry(attempts=3, backoff_s=0.05, max_delay_s=5)


def _tensor_model(stack: Stack, name: str, **extra: Any) -> None:
    """A tensor model no worker serves: its jobs stay queued."""
    config = {"handler": "tests.support.echo:SlowEcho", "weights": "none", "input": {"kind": "tensor", "shape": [2]}}
    (stack.models_dir / name).mkdir()
    (stack.models_dir / name / "config.json").write_text(json.dumps(config | extra))


@pytest.fixture(scope="module")
def sdk_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """The API, one worker for digits and slow (no delay), the webhook sender; 'full' and 'once' unserved."""
    stack = new_stack(tmp_path_factory.mktemp("sdk"), INFERQ_TEST_SLOW_S="0")
    _tensor_model(stack, "full", max_queue_length=1)
    _tensor_model(stack, "once")
    with serving(stack) as running:
        running.start_api()
        running.start_worker("digits", "slow")
        running.start("webhooks", name="webhooks")
        running.wait_for_worker("digits")
        running.wait_for_worker("slow")
        yield running


@pytest.fixture
def client(sdk_stack: Stack) -> Iterator[Client]:
    with Client(sdk_stack.base, retry=QUICK) as connected:
        yield connected


def test_importing_the_sdk_does_not_import_torch() -> None:
    code = "import sys, inferq.client; assert 'httpx' in sys.modules; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_run_submit_and_wait_return_typed_jobs(client: Client, tmp_path: Path, digits_heldout: tuple[Any, Any]) -> None:
    pngs, labels = digits_heldout
    path = tmp_path / "digit.png"
    path.write_bytes(pngs[0])
    job = client.run("digits", image=path, timeout=30)
    assert job.status == "finished" and job.done and job.result["label"] == labels[0]
    assert job.ended_at is not None and job.started_at is not None and job.ended_at >= job.started_at
    assert job.worker and job.batch_size and job.batch_size >= 1
    queued = client.submit("digits", file=pngs[1])
    assert queued.status in ("queued", "started", "finished") and queued.urls is not None
    assert queued.urls.self == f"{client.base_url}/v1/jobs/{queued.id}"
    finished = client.wait(queued.id, timeout=30)
    assert finished.result["label"] == labels[1]
    again = client.get(queued.id)  # expires_at is computed at each read
    assert (again.id, again.status, again.result, again.ended_at) == (
        queued.id,
        "finished",
        finished.result,
        finished.ended_at,
    )
    assert client.run("slow", inputs=[0.5, 2.0], timeout=30).result == {"output": [0.5, 2.0]}


def test_models_are_typed(client: Client) -> None:
    listing = client.models()
    by_name = {model.name: model for model in listing.models}
    assert set(by_name) == {"digits", "digits-batch", "slow", "fragile", "full", "once"}
    assert by_name["digits"].workers == 1 and by_name["digits"].labels == [str(n) for n in range(10)]
    assert by_name["slow"].input == {"kind": "tensor", "shape": [2], "dtype": "float32"}
    assert listing.invalid == [] and client.model("slow") == by_name["slow"]


def test_errors_are_one_tree(client: Client) -> None:
    with pytest.raises(NotFound) as unknown:
        client.get("no-such-job")
    assert unknown.value.status == 404 and unknown.value.code == "not_found"
    with pytest.raises(NotFound):
        client.submit("nope", inputs=[1, 2])
    with pytest.raises(InvalidInput) as shape:
        client.submit("slow", inputs=[1, 2, 3])
    assert "expected an array of length 2" in shape.value.message
    with pytest.raises(UnsupportedMedia):
        client.submit("digits", image=b"not an image")
    with pytest.raises(JobFailed) as poisoned:
        client.run("slow", inputs=[666, 1], timeout=30)
    assert poisoned.value.job.status == "failed" and "poison" in (poisoned.value.job.error or "")
    with pytest.raises(Conflict):
        client.cancel(poisoned.value.job.id)
    with pytest.raises(TypeError):
        client.submit("slow")


def test_a_job_that_does_not_end_times_out_and_can_be_canceled(client: Client) -> None:
    job = client.submit("once", inputs=[1, 2])
    with pytest.raises(WaitTimeout) as late:
        client.wait(job.id, timeout=0.5)
    assert isinstance(late.value, TimeoutError) and late.value.job.status == "queued"
    assert client.cancel(job.id).status == "canceled"
    with pytest.raises(JobFailed) as canceled:
        client.wait(job.id, timeout=5)
    assert canceled.value.job.status == "canceled"


def test_a_full_queue_raises_queue_full_with_retry_after(client: Client) -> None:
    client.submit("full", inputs=[1, 2])
    with pytest.raises(QueueFull) as full:
        client.submit("full", inputs=[3, 4])
    assert full.value.status == 429 and full.value.retry_after_s == 1.0


def test_events_iterate_to_the_terminal_status(client: Client, digits_heldout: tuple[Any, Any]) -> None:
    job = client.submit("digits", file=digits_heldout[0][3])
    seen = list(client.events(job.id))
    statuses = [event.status for event in seen]
    assert statuses[-1] == "finished" and seen[-1].result["label"] == digits_heldout[1][3]
    assert statuses == [s for s in ("queued", "started", "finished") if s in statuses]


def test_async_client_has_the_same_methods(sdk_stack: Stack, digits_heldout: tuple[Any, Any]) -> None:
    pngs, labels = digits_heldout

    async def use() -> tuple[Job, list[str], Job, list[str]]:
        async with AsyncClient(sdk_stack.base, retry=QUICK) as inferq:
            ran = await inferq.run("digits", image=pngs[4], timeout=30)
            submitted = await inferq.submit("slow", inputs=[1.5, 2.5])
            statuses = [event.status async for event in inferq.events(submitted.id)]
            waited = await inferq.wait(submitted.id, timeout=30)
            names = [model.name for model in (await inferq.models()).models]
            with pytest.raises(NotFound):
                await inferq.get("no-such-job")
            return ran, statuses, waited, names

    ran, statuses, waited, names = asyncio.run(use())
    assert ran.result["label"] == labels[4]
    assert statuses[-1] == "finished" and waited.result == {"output": [1.5, 2.5]}
    assert "digits" in names


class _Proxy(BaseHTTPRequestHandler):
    """Forwards to the API, except that it answers the first requests as the test's ``script`` says."""

    target = ""
    script: list[str] = []
    cut_after = 0  # lines sent before a "cut"
    seen: list[tuple[str, dict[str, str], bytes]] = []

    def _handle(self) -> None:
        body = self.rfile.read(int(self.headers.get("content-length") or 0))
        headers = {name.lower(): value for name, value in self.headers.items()}
        self.seen.append((f"{self.command} {self.path}", headers, body))
        step = self.script.pop(0) if self.script else "forward"
        if step == "503":
            self.send_response(503)
            self.send_header("Retry-After", "1")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        forwarded = {k: v for k, v in headers.items() if k not in ("host", "content-length", "connection")}
        answer = httpx.request(self.command, self.target + self.path, headers=forwarded, content=body, timeout=60)
        if step == "drop":  # the API did the work; its answer is lost on the way back
            self.close_connection = True
            return
        if step == "cut":  # the connection breaks after the answer's first lines
            self.send_response(answer.status_code)
            self.send_header("Content-Type", answer.headers["content-type"])
            self.send_header("Content-Length", str(len(answer.content)))
            self.end_headers()
            self.wfile.write(b"".join(answer.content.splitlines(keepends=True)[: self.cut_after]))
            self.close_connection = True
            return
        self.send_response(answer.status_code)
        for name in ("content-type", "location", "retry-after"):
            if name in answer.headers:
                self.send_header(name, answer.headers[name])
        self.send_header("Content-Length", str(len(answer.content)))
        self.end_headers()
        self.wfile.write(answer.content)

    do_GET = do_POST = _handle

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def proxy(sdk_stack: Stack) -> Iterator[type[_Proxy]]:
    handler = type("Proxy", (_Proxy,), {"target": sdk_stack.base, "script": [], "seen": []})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    handler.target, handler.url = sdk_stack.base, f"http://127.0.0.1:{server.server_address[1]}"  # type: ignore[attr-defined]
    try:
        yield handler
    finally:
        server.shutdown()
        server.server_close()


def test_a_submit_whose_answer_is_lost_is_retried_with_its_key_and_makes_one_job(
    client: Client, proxy: type[_Proxy]
) -> None:
    proxy.script = ["drop", "503"]
    with Client(proxy.url, retry=QUICK) as through:  # type: ignore[attr-defined]
        job = through.submit("once", inputs=[5, 6])
    submits = [headers for line, headers, _ in proxy.seen if line == "POST /v1/models/once/jobs"]
    assert len(submits) == 3
    assert len({headers["idempotency-key"] for headers in submits}) == 1
    assert client.model("once").queue_length == 1
    assert client.get(job.id).status == "queued"
    assert "priority" not in json.loads(proxy.seen[0][2])  # sent only when given


def test_a_cancel_whose_answer_is_lost_is_not_sent_again(client: Client, proxy: type[_Proxy]) -> None:
    job = client.submit("once", inputs=[7, 8])
    proxy.script = ["drop"]
    with Client(proxy.url, retry=QUICK) as through, pytest.raises(TransportError):  # type: ignore[attr-defined]
        through.cancel(job.id)
    assert [line for line, _, _ in proxy.seen] == [f"POST /v1/jobs/{job.id}/cancel"]
    assert client.get(job.id).status == "canceled"  # it was canceled; only the answer was lost


class _Receiver(BaseHTTPRequestHandler):
    deliveries: list[tuple[dict[str, str], bytes]] = []

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("content-length") or 0))
        self.deliveries.append((dict(self.headers.items()), body))
        self.send_response(204)
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


def test_a_real_delivery_verifies_like_the_standard_webhooks_library(client: Client) -> None:
    receiver = ThreadingHTTPServer(("127.0.0.1", 0), _Receiver)
    threading.Thread(target=receiver.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{receiver.server_address[1]}/hook"
        job = client.run("slow", inputs=[3, 4], webhook=url, timeout=30)
        wait_until(lambda: _Receiver.deliveries, 30, "the webhook delivery")
    finally:
        receiver.shutdown()
        receiver.server_close()
    headers, body = _Receiver.deliveries[0]
    delivered = verify_webhook(WEBHOOK_SECRET, headers, body)
    assert delivered.id == job.id and delivered.status == "finished" and delivered.result == {"output": [3.0, 4.0]}
    assert standardwebhooks.Webhook(WEBHOOK_SECRET).verify(body, headers)["id"] == job.id
    with pytest.raises(WebhookVerificationError):
        verify_webhook(WEBHOOK_SECRET, headers, body.replace(b"finished", b"failed__"))


def _items(count: int, prefix: str) -> list[dict[str, Any]]:
    return [{"custom_id": f"{prefix}-{n}", "inputs": [n, n]} for n in range(count)]


def test_a_batch_is_uploaded_followed_to_its_end_and_read_again_from_an_offset(client: Client) -> None:
    refused = ['{"custom_id": "short", "inputs": [1]}', b"not json"]
    batch = client.create_batch("slow", [*_items(12, "b"), *refused])
    assert isinstance(batch, Batch) and batch.model == "slow" and batch.priority == "bulk"
    assert (batch.total, batch.refused_count) == (13, 2)  # a refused line with a custom_id fails alone
    assert [(r.line, r.custom_id) for r in batch.refused] == [(13, "short"), (14, None)]
    assert batch.urls is not None and batch.urls.results == f"{client.base_url}/v1/batches/{batch.id}/results"
    lines = list(client.batch_results(batch.id, follow=True))
    by_id = {line.custom_id: line for line in lines}
    assert len(lines) == len(by_id) == 13
    assert by_id["b-3"] == BatchResult("b-3", "finished", {"output": [3.0, 3.0]}, version=1)  # slow: no weights
    assert by_id["short"].status == "failed" and "line 13" in (by_id["short"].error or "")
    ended = client.get_batch(batch.id)
    assert ended.done and ended.status == "finished" and ended.ended_at is not None
    assert ended.counts | {"finished": 12, "failed": 1, "total": 13} == ended.counts
    # Read again: the same lines, from any offset; as the API writes them.
    assert list(client.batch_results(batch.id, offset=10)) == lines[10:]
    assert [line.custom_id for line in client.batch_results(batch.id, status="failed")] == ["short"]
    raw = httpx.get(f"{client.base_url}/v1/batches/{batch.id}/results").text.splitlines()
    assert [line.to_dict() for line in lines] == [json.loads(line) for line in raw]
    with pytest.raises(Conflict):
        client.cancel_batch(batch.id)
    with pytest.raises(NotFound):
        client.get_batch("no-such-batch")


def test_a_batch_from_a_file_is_made_once_per_key_and_can_be_canceled(client: Client, tmp_path: Path) -> None:
    source = tmp_path / "items.jsonl"
    source.write_text("".join(json.dumps(item) + "\n" for item in _items(3, "c")))
    batch = client.create_batch("once", source, priority="interactive", idempotency_key="upload-1")
    again = client.create_batch("once", source, priority="interactive", idempotency_key="upload-1")
    assert again.id == batch.id and batch.priority == "interactive" and batch.status == "queued"
    assert client.model("once").queue_lengths["interactive"] >= 1
    assert client.cancel_batch(batch.id).id == batch.id
    lines = list(client.batch_results(batch.id, follow=True))
    assert sorted((line.custom_id, line.status) for line in lines) == [(f"c-{n}", "canceled") for n in range(3)]
    assert client.get_batch(batch.id).status == "canceled"


def test_a_results_read_cut_off_resumes_where_it_stopped(client: Client, proxy: type[_Proxy]) -> None:
    batch = client.create_batch("slow", _items(9, "r"))
    expected = list(client.batch_results(batch.id, follow=True))
    proxy.script, proxy.cut_after = ["cut"], 4
    with Client(proxy.url, retry=QUICK) as through:  # type: ignore[attr-defined]
        lines = list(through.batch_results(batch.id))
    assert lines == expected
    reads = [line for line, _, _ in proxy.seen if "/results" in line]
    assert reads == [f"GET /v1/batches/{batch.id}/results?offset=0", f"GET /v1/batches/{batch.id}/results?offset=4"]


def test_async_client_has_the_bulk_helpers(sdk_stack: Stack) -> None:
    async def use() -> tuple[Batch, list[BatchResult], Batch]:
        async with AsyncClient(sdk_stack.base, retry=QUICK) as inferq:
            batch = await inferq.create_batch("slow", _items(3, "a"))
            lines = [line async for line in inferq.batch_results(batch.id, follow=True)]
            return batch, lines, await inferq.get_batch(batch.id)

    batch, lines, ended = asyncio.run(use())
    assert sorted(line.custom_id for line in lines) == ["a-0", "a-1", "a-2"]
    assert ended.id == batch.id and ended.done and ended.counts["finished"] == 3


def test_an_upload_may_be_a_name_and_bytes(client: Client, digits_heldout: tuple[Any, Any]) -> None:
    job = client.run("digits", file=("digit.png", digits_heldout[0][5]), timeout=30)
    assert job.result["label"] == digits_heldout[1][5]
