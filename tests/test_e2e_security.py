"""API keys, queue limits, idempotency, deadlines, webhook targets, CORS, secrets in errors."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from api.app import create_app
from shared.redis_server import free_port
from shared.settings import Settings
from tests.stack import Stack, new_stack, serving, wait_until

pytestmark = pytest.mark.e2e
A = {"Authorization": "Bearer key-a"}
B = {"Authorization": "Bearer key-b"}


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """An API with two keys, a queue limit of 3 and no webhook allow-list; no workers."""
    env = {"INFERQ_API_KEYS": "key-a,key-b", "INFERQ_MAX_QUEUE_LENGTH": "3", "INFERQ_WEBHOOK_ALLOW": ""}
    with serving(new_stack(tmp_path_factory.mktemp("secured"), **env)) as running:
        running.start_api()
        yield running


@pytest.fixture(autouse=True)
def _empty_queues(secured: Stack) -> None:
    client = secured.redis()
    client.flushall()
    client.close()


def submit(stack: Stack, values: list[float], headers: dict[str, str] = A, **extra: object) -> httpx.Response:
    return httpx.post(f"{stack.base}/v1/models/slow/jobs", json={"inputs": values, **extra}, headers=headers)


def test_every_route_but_health_and_docs_needs_a_key(secured: Stack) -> None:
    for method, path in (
        ("GET", "/v1/models"),
        ("GET", "/v1/models/slow"),
        ("GET", "/v1/jobs/x"),
        ("POST", "/v1/jobs/x/cancel"),
        ("GET", "/v1/jobs/x/events"),
    ):
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "key-a"}):
            response = httpx.request(method, f"{secured.base}{path}", headers=headers)
            assert response.status_code == 401, (path, headers)
            assert response.headers["www-authenticate"] == "Bearer"
            assert response.json()["error"]["code"] == "unauthorized"
    assert submit(secured, [1, 2], headers={}).status_code == 401
    for path in ("/healthz", "/readyz", "/openapi.json", "/docs"):
        assert httpx.get(f"{secured.base}{path}").status_code == 200
    assert httpx.get(f"{secured.base}/v1/models", headers=A).status_code == 200


def test_a_key_sees_and_cancels_only_its_own_jobs(secured: Stack) -> None:
    job_id = submit(secured, [1, 2]).json()["id"]
    url = f"{secured.base}/v1/jobs/{job_id}"
    assert httpx.get(url, headers=A).json()["status"] == "queued"
    assert httpx.get(url, headers=B).status_code == 404
    assert httpx.post(f"{url}/cancel", headers=B).status_code == 404
    assert httpx.get(f"{url}/events", headers=B).status_code == 404
    assert httpx.get(url, headers=A).json()["status"] == "queued"
    assert httpx.post(f"{url}/cancel", headers=A).json()["status"] == "canceled"


def test_a_full_queue_answers_429_and_keeps_nothing_of_the_refused_job(secured: Stack) -> None:
    for i in range(3):
        assert submit(secured, [i, i]).status_code == 202
    refused = submit(secured, [9, 9])
    assert refused.status_code == 429
    assert refused.headers["retry-after"] == "1"
    assert refused.json()["error"]["code"] == "queue_full"
    client = secured.redis()
    assert client.llen("rq:queue:inferq.slow") == 3
    assert len(client.keys("inferq:payload:*")) == 3
    assert len(client.keys("inferq:job:*")) == 3
    assert len(client.keys("rq:job:*")) == 3
    client.close()


def test_idempotency_key_returns_the_same_job_and_refuses_a_different_body(secured: Stack) -> None:
    first = submit(secured, [1, 2], headers={**A, "Idempotency-Key": "order-17"})
    again = submit(secured, [1, 2], headers={**A, "Idempotency-Key": "order-17"})
    assert first.status_code == again.status_code == 202
    assert first.json()["id"] == again.json()["id"]
    assert first.json()["enqueued_at"] == again.json()["enqueued_at"] is not None
    other_body = submit(secured, [3, 4], headers={**A, "Idempotency-Key": "order-17"})
    assert other_body.status_code == 422
    assert "Idempotency-Key" in other_body.json()["error"]["message"]
    other_key = submit(secured, [1, 2], headers={**B, "Idempotency-Key": "order-17"})
    assert other_key.status_code == 202 and other_key.json()["id"] != first.json()["id"]
    client = secured.redis()
    assert client.llen("rq:queue:inferq.slow") == 2
    idem_keys = client.keys("inferq:idem:*")
    assert len(idem_keys) == 2 and all(0 < client.ttl(k) <= 86400 for k in idem_keys)
    client.close()


def test_a_job_past_its_deadline_never_runs_and_reads_expired(secured: Stack) -> None:
    response = submit(secured, [1, 2], ttl=1)
    assert response.status_code == 202
    job_id = response.json()["id"]
    time.sleep(1.6)
    secured.run_burst("slow")
    view = httpx.get(f"{secured.base}/v1/jobs/{job_id}", headers=A).json()
    assert view["status"] == "expired"
    assert "never ran" in view["error"] and view["result"] is None
    for bad in (0, -1, 10**9, "soon", True):
        assert submit(secured, [1, 2], ttl=bad).status_code == 422


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:9/hook",
        "http://localhost/hook",
        "http://[::1]/hook",
        "http://2130706433/hook",
        "http://169.254.169.254/latest/meta-data",
        "http://10.0.0.7/hook",
        "http://0.0.0.0/hook",
        "ftp://example.com/hook",
    ],
)
def test_webhooks_to_private_or_metadata_addresses_are_refused(secured: Stack, url: str) -> None:
    response = submit(secured, [1, 2], webhook=url)
    assert response.status_code == 422, url
    client = secured.redis()
    assert client.keys("inferq:payload:*") == []
    client.close()


def test_cors_is_off_unless_configured(secured: Stack, redis_url: str, tmp_path: Path) -> None:
    preflight = {"Origin": "https://app.example", "Access-Control-Request-Method": "POST"}
    response = httpx.options(f"{secured.base}/v1/models/slow/jobs", headers=preflight)
    assert "access-control-allow-origin" not in response.headers
    settings = Settings(redis_url=redis_url, cors_origins=["https://app.example"])
    app = create_app(settings)  # preflights are answered by the middleware alone: no lifespan needed

    async def ask(origin: str) -> httpx.Response:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://inferq") as client:
            return await client.options("/v1/models/slow/jobs", headers={**preflight, "Origin": origin})

    assert asyncio.run(ask("https://app.example")).headers["access-control-allow-origin"] == "https://app.example"
    assert "access-control-allow-origin" not in asyncio.run(ask("https://evil.example")).headers


def test_the_redis_password_never_appears_in_errors_or_logs(tmp_path: Path) -> None:
    stack = new_stack(tmp_path)
    stack.redis_server.stop()
    secret = "s3cret-pa55word"
    stack.env["INFERQ_REDIS_URL"] = f"redis://:{secret}@127.0.0.1:{free_port()}/0"
    try:
        stack.start("api", "--port", str(stack.port), name="api")
        wait_until(lambda: _status(f"{stack.base}/healthz") == 200, 30, "the API process")
        for path in ("/readyz", "/v1/models", "/v1/jobs/abc"):
            response = httpx.get(f"{stack.base}{path}")
            assert response.status_code == 503, path
            assert response.headers["retry-after"] == "1"
            assert secret not in response.text
        response = submit(stack, [1, 2], headers={})
        assert response.status_code == 503 and secret not in response.text
    finally:
        stack.stop_all()
    assert secret not in stack.log_text()


def _status(url: str) -> int:
    try:
        return httpx.get(url, timeout=1).status_code
    except httpx.HTTPError:
        return 0
