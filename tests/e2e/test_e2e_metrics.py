"""GET /metrics over real HTTP: two API processes, a worker, the webhook sender and Redis, as processes."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from inferq.shared.redis_server import free_port
from tests.support.stack import Stack, new_stack, serving
from tests.support.waiting import wait_until

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Stack, str]]:
    """Two API processes (the stack's, and a second one's base URL), a worker for digits and fragile."""
    with serving(new_stack(tmp_path_factory.mktemp("metrics"))) as stack:
        stack.start_api()
        second = f"http://127.0.0.1:{free_port()}"
        stack.start("api", "--port", second.rsplit(":", 1)[1], name="api2")
        wait_until(lambda: _ready(second), 30, "the second API")
        stack.start_worker("digits", "fragile")
        stack.start("webhooks", name="webhooks")
        stack.wait_for_worker("digits")
        yield stack, second


def _ready(base: str) -> bool:
    try:
        return httpx.get(f"{base}/readyz", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


def scrape(base: str) -> Samples:
    """Every sample of one scrape, by name and labels, parsed by prometheus_client's own parser."""
    response = httpx.get(f"{base}/metrics", timeout=10)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain; version=0.0.4")
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(response.text)
        for sample in family.samples
    }


# The per-job families, labelled by tenant (no tenants here: the default one).
PER_JOB = ("inferq_jobs_ended", "inferq_job_failures", "inferq_job_queued", "inferq_job_inference", "inferq_job_end_to")


def value(samples: Samples, name: str, **labels: str) -> float:
    if "model" in labels:
        labels.setdefault("version", "1")  # the models here have one version
    if name.startswith(PER_JOB):
        labels.setdefault("tenant", "default")
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def _submit_digit(base: str, png: bytes, **data: str) -> str:
    response = httpx.post(
        f"{base}/v1/models/digits/jobs", files={"file": ("d.png", png, "image/png")}, data=data, timeout=30
    )
    assert response.status_code == 202, response.text
    return str(response.json()["id"])


def _ended(base: str, job_id: str) -> dict[str, Any]:
    view: dict[str, Any] = httpx.get(f"{base}/v1/jobs/{job_id}?wait=30", timeout=40).json()
    assert view["status"] in ("finished", "failed"), view
    return view


def test_after_n_jobs_every_histogram_grew_by_n_and_batch_sizes_match_the_job_views(
    cluster: tuple[Stack, str], digits_heldout: tuple[Any, Any]
) -> None:
    stack, _ = cluster
    pngs, labels = digits_heldout
    n = 40
    before = scrape(stack.base)
    with ThreadPoolExecutor(16) as pool:  # concurrent submits, so the worker forms batches of several
        ids = list(pool.map(lambda png: _submit_digit(stack.base, png), pngs[:n]))
        views = list(pool.map(lambda i: _ended(stack.base, i), ids))
    after = scrape(stack.base)

    assert all(v["status"] == "finished" and v["result"]["label"] in labels for v in views)

    def grew(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    assert grew("inferq_jobs_ended_total", model="digits", status="finished") == n
    for histogram in ("inferq_job_queued_seconds", "inferq_job_inference_seconds", "inferq_job_end_to_end_seconds"):
        assert grew(f"{histogram}_count", model="digits") == n, histogram
        assert grew(f"{histogram}_bucket", model="digits", le="+Inf") == n, histogram
    sizes = [v["batch_size"] for v in views]
    batches = sum(1 / size for size in sizes)  # a batch of b jobs: b views that say b
    assert round(batches, 6) == int(round(batches, 6))
    assert grew("inferq_batch_size_sum", model="digits") == n == len(sizes)
    assert grew("inferq_batch_size_count", model="digits") == round(batches)
    assert value(after, "inferq_queue_depth", model="digits", lane="interactive") == 0
    assert value(after, "inferq_workers", model="digits", state="idle") == 1
    assert value(after, "inferq_workers", model="fragile", state="idle") == 1


def test_a_failed_item_counts_under_its_reason_and_shows_on_the_status(cluster: tuple[Stack, str]) -> None:
    stack, _ = cluster
    before = scrape(stack.base)
    response = httpx.post(f"{stack.base}/v1/models/fragile/jobs", json={"inputs": [666.0, 666.0]}, timeout=10)
    assert response.status_code == 202
    view = _ended(stack.base, response.json()["id"])
    assert view["status"] == "failed"
    after = scrape(stack.base)
    anyone = ("tenant", "default")
    failed = ("inferq_job_failures_total", (("model", "fragile"), ("reason", "ModelError"), anyone, ("version", "1")))
    assert after[failed] - before.get(failed, 0.0) == 1
    ended = ("inferq_jobs_ended_total", (("model", "fragile"), ("status", "failed"), anyone, ("version", "1")))
    assert after[ended] - before[ended] == 1
    status = httpx.get(f"{stack.base}/v1/status", timeout=10).json()
    fragile = next(m for m in status["models"] if m["name"] == "fragile")
    assert fragile["failures"][0]["reason"] == "ModelError"
    assert fragile["failures"][0]["error"] == view["error"]
    assert fragile["ended_total"]["failed"] >= 1


class _Receiver(BaseHTTPRequestHandler):
    received: list[dict[str, Any]] = []

    def do_POST(self) -> None:  # noqa: N802 (http.server's spelling)
        body = self.rfile.read(int(self.headers["content-length"]))
        _Receiver.received.append(json.loads(body))
        self.send_response(204)
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


def test_a_webhook_delivery_counts_with_its_latency(
    cluster: tuple[Stack, str], digits_heldout: tuple[Any, Any]
) -> None:
    stack, _ = cluster
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Receiver)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        before = scrape(stack.base)
        hook = f"http://127.0.0.1:{server.server_address[1]}/hook"
        job_id = _submit_digit(stack.base, digits_heldout[0][0], webhook=hook)
        wait_until(lambda: any(r["id"] == job_id for r in _Receiver.received), 30, "the webhook")
        delivered = ("inferq_webhook_deliveries_total", (("outcome", "delivered"),))
        wait_until(lambda: scrape(stack.base)[delivered] > before[delivered], 10, "the delivery to be counted")
        after = scrape(stack.base)
        assert after[delivered] - before[delivered] == 1
        timed = ("inferq_webhook_delivery_seconds_count", ())
        assert after[timed] - before[timed] == 1
        assert after[("inferq_webhook_deliveries_total", (("outcome", "gave_up"),))] == 0
    finally:
        server.shutdown()
        server.server_close()


def test_requests_count_by_route_template_and_status_across_both_api_processes(cluster: tuple[Stack, str]) -> None:
    stack, second = cluster
    route = ("route", "/v1/jobs/{job_id}")
    missing = ("inferq_http_requests_total", (("method", "GET"), route, ("status", "404")))
    cancel_route = ("route", "/v1/jobs/{job_id}/cancel")
    cancel = ("inferq_http_requests_total", (("method", "POST"), cancel_route, ("status", "404")))
    timed = ("inferq_http_request_seconds_count", (("method", "GET"), route))
    # The earlier tests' polls of their jobs (GET /v1/jobs/{job_id}, 200) reach Redis at each process's next
    # flush, once a second: start counting once the count has stopped moving across more than one flush.
    before = scrape(stack.base)
    for _ in range(20):
        time.sleep(1.5)
        now = scrape(stack.base)
        if now.get(timed) == before.get(timed):
            break
        before = now
    for base, count in ((stack.base, 3), (second, 4)):
        for i in range(count):
            assert httpx.get(f"{base}/v1/jobs/no-such-job-{i}").status_code == 404
    assert httpx.post(f"{second}/v1/jobs/no-such-job/cancel").status_code == 404
    assert httpx.get(f"{second}/no/such/path").status_code == 404

    unmatched = ("inferq_http_requests_total", (("method", "GET"), ("route", "unmatched"), ("status", "404")))
    expected = {missing: 7, cancel: 1, unmatched: 1}

    def grown(samples: Samples) -> dict[Any, float]:
        return {key: samples.get(key, 0.0) - before.get(key, 0.0) for key in expected}

    # Each process flushes its counts once a second: wait until both have, then the sums are exact.
    wait_until(lambda: all(g >= expected[k] for k, g in grown(scrape(second)).items()), 10, "both flushes")
    after = scrape(stack.base)  # either process shows the whole cluster
    assert grown(after) == expected
    assert not any("no-such-job" in dict(labels).get("route", "") for _, labels in after)
    assert after[timed] - before.get(timed, 0.0) == 7
