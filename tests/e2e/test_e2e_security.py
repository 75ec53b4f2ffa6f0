"""API keys, queue limits, idempotency, deadlines, webhook targets, CORS, secrets in errors."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable, Iterator
from pathlib import Path

import httpx
import pytest
from starlette.routing import BaseRoute, Mount, Route
from starlette.staticfiles import StaticFiles

from inferq.api import auth
from inferq.api.app import create_app
from inferq.shared.redis_server import free_port
from inferq.shared.settings import Settings
from tests.support.models import ROOT
from tests.support.stack import Stack, new_stack, serving
from tests.support.waiting import wait_until

# The configuration reference, generated from the settings' descriptions (docs/hooks.py).
CONFIGURATION = ROOT / "docs" / "configuration.md"

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


# What stays open with keys set: health and the protocol's server metadata, the docs, /metrics (counts only) and
# the status page's own files (no data). The INFERQ_API_KEYS row of docs/configuration.md and the start-up line
# say the same.
OPEN = {
    ("GET", path)
    for path in (
        "/healthz",
        "/readyz",
        "/v2/health/live",
        "/v2/health/ready",
        "/v2",
        "/metrics",
        "/docs",
        "/docs/oauth2-redirect",
        "/redoc",
        "/openapi.json",
        "/static-offline-docs/*",
        "/",
        "/static/*",
    )
}
PATH_PARAMETERS = {"{model}": "slow", "{version}": "1", "{job_id}": "x", "{batch_id}": "x"}


def every_route(routes: Iterable[BaseRoute]) -> Iterator[tuple[str, str, str]]:
    """(method, template, a URL path to call) of each route of the app; "/*" marks a folder of files."""
    for route in routes:
        included = getattr(route, "original_router", None)  # FastAPI resolves an included router lazily
        if included is not None:
            yield from every_route(included.routes)
        elif isinstance(route, Mount):
            assert isinstance(route.app, StaticFiles) and route.app.directory is not None, route.path
            a_file = sorted(p.name for p in Path(route.app.directory).iterdir() if p.is_file())[0]
            yield "GET", f"{route.path}/*", f"{route.path}/{a_file}"
        else:
            assert isinstance(route, Route), route
            url = route.path
            for name, value in PATH_PARAMETERS.items():
                url = url.replace(name, value)
            assert "{" not in url, route.path
            for method in sorted((route.methods or set()) - {"HEAD"}):
                yield method, route.path, url


def test_every_route_needs_a_key_but_health_docs_metrics_and_the_pages_files(secured: Stack) -> None:
    app = create_app(Settings(redis_url=secured.redis_url, models_dir=secured.models_dir, api_keys=["key-a"]))
    routes = list(every_route(app.routes))
    assert len(routes) > 30 and {(method, template) for method, template, _ in routes} >= OPEN
    for method, template, url in routes:
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "key-a"}):
            response = httpx.request(method, f"{secured.base}{url}", headers=headers, timeout=10)
            if (method, template) in OPEN:
                assert response.status_code == 200, (method, url, headers, response.text[:200])
                continue
            assert response.status_code == 401, (method, url, headers)
            assert response.headers["www-authenticate"] == "Bearer"
            # The OIP routes answer in the protocol's own error body (api/errors.py).
            error = response.json()["error"]
            assert (
                error == "a valid API key is required: Authorization: Bearer <key>" or error["code"] == "unauthorized"
            )
    assert httpx.get(f"{secured.base}/v1/models", headers=A).status_code == 200
    assert set(auth.OPEN_PATHS) == {template for _, template in OPEN}
    keys_row = next(line for line in CONFIGURATION.read_text().splitlines() if line.startswith("| `INFERQ_API_KEYS` |"))
    assert [path for path in auth.OPEN_PATHS if f"`{path}`" not in keys_row] == []


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

    def ask(origin: str) -> httpx.Response:
        return _in_process(app, "OPTIONS", "/v1/models/slow/jobs", {**preflight, "Origin": origin})

    assert ask("https://app.example").headers["access-control-allow-origin"] == "https://app.example"
    assert "access-control-allow-origin" not in ask("https://evil.example").headers


def _in_process(app: object, method: str, path: str, headers: dict[str, str]) -> httpx.Response:
    """One request to ``app`` in this process (no lifespan: what the CORS middleware answers on its own)."""

    async def send() -> httpx.Response:
        transport = httpx.ASGITransport(app=app)  # type: ignore[arg-type]
        async with httpx.AsyncClient(transport=transport, base_url="http://inferq") as client:
            return await client.request(method, path, headers=headers)

    return asyncio.run(send())


def test_cors_lets_a_page_use_every_route_and_read_the_headers_it_needs(redis_url: str) -> None:
    """A rollout from a browser page (PUT, DELETE) was refused at its preflight, a traced request's header too, and
    a page could not read a job's Location or a 503's Retry-After."""
    app = create_app(Settings(redis_url=redis_url, cors_origins=["https://app.example"]))

    def preflight(path: str, method: str, headers: str) -> httpx.Response:
        asked = {
            "Origin": "https://app.example",
            "Access-Control-Request-Method": method,
            "Access-Control-Request-Headers": headers,
        }
        return _in_process(app, "OPTIONS", path, asked)

    for path, method in (("/v1/models/slow/rollout", "PUT"), ("/v1/models/slow/rollout", "DELETE")):
        answer = preflight(path, method, "authorization,content-type")
        assert answer.status_code == 200, (method, answer.text)
    traced = preflight("/v1/models/slow/jobs", "POST", "content-type,prefer,traceparent,tracestate")
    assert traced.status_code == 200, traced.text
    # Any answer to a page's origin (no lifespan here: a path with no route).
    page = _in_process(app, "GET", "/no-such-route", {"Origin": "https://app.example"})
    exposed = {h.strip().lower() for h in page.headers["access-control-expose-headers"].split(",")}
    assert {"location", "retry-after", "preference-applied"} <= exposed


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
