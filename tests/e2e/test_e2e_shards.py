"""Past one Redis: a model placed on a second Redis deployment (INFERQ_REDIS_SHARDS, its config's "redis"), end to
end through real processes: submit, read, wait, SSE, cancel, webhook, bulk, metrics and rq info, each Redis
holding only its own models' jobs."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis as redis_py

from inferq.shared import shards
from inferq.shared.redis_server import RedisServer, free_port
from tests.support.models import ROOT
from tests.support.stack import Stack, new_stack, serving
from tests.support.up import up_serving
from tests.support.waiting import wait_until
from tests.support.webhooks import Receiver


@pytest.fixture(scope="module")
def two(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Stack, RedisServer]]:
    """Model ``slow`` on INFERQ_REDIS_URL's Redis, ``far`` (the same handler) on Redis ``b``."""
    tmp = tmp_path_factory.mktemp("shards")
    other = RedisServer(tmp / "redis-b", appendonly=False)
    other.start()
    stack = new_stack(tmp, INFERQ_REDIS_SHARDS=f"b={other.url}", INFERQ_TEST_SLOW_S="0.2")
    shutil.copytree(stack.models_dir / "slow", stack.models_dir / "far")
    config = json.loads((stack.models_dir / "far" / "config.json").read_text())
    (stack.models_dir / "far" / "config.json").write_text(json.dumps(config | {"redis": "b"}))
    try:
        with serving(stack) as running:
            running.start_api()
            running.start_worker("slow", name="worker-slow")
            running.start("webhooks", name="webhooks")
            running.start("webhooks", "--redis", "b", name="webhooks-b")
            running.wait_for_worker("slow")
            yield running, other
    finally:
        other.stop()


def post(stack: Stack, model: str, value: float, **extra: Any) -> httpx.Response:
    headers = extra.pop("headers", {})
    return httpx.post(
        f"{stack.base}/v1/models/{model}/jobs", json={"inputs": [value, value], **extra}, headers=headers, timeout=40
    )


def test_each_job_lives_on_its_models_redis_and_its_id_leads_back_to_it(two: tuple[Stack, RedisServer]) -> None:
    stack, other = two
    worker = stack.start_worker("far", name="worker-far")
    try:
        near = post(stack, "slow", 1.0, headers={"Prefer": "wait=30"})
        far = post(stack, "far", 2.0, headers={"Prefer": "wait=30"})
        assert near.status_code == 200 and far.status_code == 200, (near.text, far.text)
        near_id, far_id = near.json()["id"], far.json()["id"]
        assert far_id.startswith("b-") and not near_id.startswith("b-")
        assert shards.of_id(far_id, {"b"}) == "b"
        home, b = stack.redis(), redis_py.Redis.from_url(other.url)
        assert home.exists(f"rq:job:{near_id}") and not home.exists(f"rq:job:{far_id}")
        assert b.exists(f"rq:job:{far_id}") and not b.exists(f"rq:job:{near_id}")
        read = httpx.get(f"{stack.base}/v1/jobs/{far_id}", timeout=10).json()
        assert (read["status"], read["result"]) == ("finished", {"output": [2.0, 2.0]})
        with httpx.stream("GET", f"{stack.base}/v1/jobs/{far_id}/events", timeout=20) as events:
            assert "event: finished" in events.read().decode()
        listing = {m["name"]: m for m in httpx.get(f"{stack.base}/v1/models", timeout=10).json()["models"]}
        assert listing["far"]["workers"] == 1 and listing["slow"]["workers"] == 1
        # Each Redis is a truthful RQ layout of its own models.
        shown = subprocess.run(
            [str(Path(sys.executable).parent / "rq"), "info", "-u", other.url],
            capture_output=True,
            text=True,
            timeout=60,
            env={k: v for k, v in os.environ.items() if not k.startswith("INFERQ_")},
        ).stdout
        assert "inferq.far" in shown and "inferq.slow " not in shown, shown
        scraped = httpx.get(f"{stack.base}/metrics", timeout=10).text
        assert 'inferq_jobs_ended_total{model="far",status="finished",tenant="default",version="1"}' in scraped
        assert 'inferq_jobs_ended_total{model="slow",status="finished",tenant="default",version="1"}' in scraped
    finally:
        worker.terminate()
        worker.wait(timeout=30)


def test_cancel_webhook_and_bulk_on_the_second_redis(two: tuple[Stack, RedisServer]) -> None:
    stack, other = two
    hooks = Receiver(statuses=[204])
    try:
        queued = post(stack, "far", 3.0)  # no worker for far yet: it waits
        assert queued.status_code == 202
        canceled = httpx.post(f"{stack.base}/v1/jobs/{queued.json()['id']}/cancel", timeout=10)
        assert canceled.status_code == 200 and canceled.json()["status"] == "canceled", canceled.text
        hooked = post(stack, "far", 4.0, webhook=hooks.url)
        lines = "".join(json.dumps({"custom_id": f"i{n}", "inputs": [n, n]}) + "\n" for n in range(5))
        uploaded = httpx.post(
            f"{stack.base}/v1/models/far/batches",
            content=lines,
            headers={"content-type": "application/jsonl"},
            timeout=30,
        )
        assert uploaded.status_code == 202, uploaded.text
        batch_id = uploaded.json()["id"]
        assert batch_id.startswith("b-")
        stack.run_burst("far")
        wait_until(lambda: len(hooks.deliveries) == 1, 30, "the webhook from Redis b's sender")
        assert json.loads(hooks.deliveries[0]["body"])["id"] == hooked.json()["id"]
        batch = httpx.get(f"{stack.base}/v1/batches/{batch_id}", timeout=10).json()
        assert (batch["status"], batch["counts"]["finished"]) == ("finished", 5)
        results = httpx.get(f"{stack.base}/v1/batches/{batch_id}/results", timeout=10).text.splitlines()
        assert sorted(json.loads(line)["custom_id"] for line in results) == [f"i{n}" for n in range(5)]
        assert redis_py.Redis.from_url(other.url).exists(f"inferq:batch:{batch_id}")
    finally:
        hooks.close()


def test_a_model_on_an_unknown_redis_is_left_out_with_its_reason(two: tuple[Stack, RedisServer]) -> None:
    stack, _ = two
    listing = httpx.get(f"{stack.base}/v1/models", timeout=10).json()
    assert "far" in {m["name"] for m in listing["models"]}
    folder = stack.models_dir / "lost"
    folder.mkdir(exist_ok=True)
    config = json.loads((stack.models_dir / "slow" / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps(config | {"redis": "c"}))
    try:
        shown = subprocess.run(
            [sys.executable, "-m", "inferq", "worker", "--model", "lost", "--burst"],
            cwd=ROOT,
            env=stack.env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert shown.returncode == 78
        assert "redis: 'c' is not in INFERQ_REDIS_SHARDS (it has: b)" in shown.stderr
    finally:
        shutil.rmtree(folder)


TENSOR = {"kind": "tensor", "shape": [2], "dtype": "float32"}


def _post(base: str, model: str, value: float, wait: bool = False) -> httpx.Response:
    headers = {"Prefer": "wait=30"} if wait else {}
    return httpx.post(f"{base}/v1/models/{model}/jobs", json={"inputs": [value, value]}, headers=headers, timeout=40)


def wait_for(call: Callable[[], httpx.Response], done: Callable[[httpx.Response], bool]) -> httpx.Response:
    """``call()`` again until ``done`` with its answer (an answer that is not JSON, or no answer: again)."""
    answers: list[httpx.Response] = []

    def answered() -> bool:
        try:
            answers.append(call())
            return done(answers[-1])
        except (httpx.HTTPError, ValueError, KeyError):
            return False

    wait_until(answered, 120, "the answer awaited")
    return answers[-1]


def test_a_shard_down_leaves_the_rest_served_and_inferq_up_starts_what_it_can(tmp_path: Path) -> None:
    """With shard b killed the audit's default model served 20/20, yet /readyz, /v1/models, /v1/status, /metrics and
    /v2/health/ready answered 503 (a readiness probe pulls every API pod); and `inferq up` started while a shard was
    down started nothing."""
    b = RedisServer(tmp_path / "redis-b", port=free_port(), appendonly=False)  # not started: down from the first
    models = tmp_path / "models"
    slow = {"handler": "tests.support.echo:SlowEcho", "weights": "none", "input": TENSOR}
    for name, config in {"slow": slow, "far": slow | {"redis": "b"}}.items():
        (models / name).mkdir(parents=True)
        (models / name / "config.json").write_text(json.dumps(config))
    settings = {"INFERQ_MODELS_DIR": str(models), "INFERQ_REDIS_SHARDS": f"b={b.url}"}
    down = "its Redis ('b') is unavailable: Redis cannot be reached"
    try:
        with up_serving(tmp_path, 120, **settings) as (_, base, _):
            ready = wait_for(
                lambda: httpx.get(f"{base}/readyz", timeout=10), lambda r: r.json()["workers"] == {"slow": 1}
            )
            assert ready.status_code == 200
            assert ready.json() == {
                "status": "degraded",
                "workers": {"slow": 1},
                "models_without_workers": [],
                "invalid_models": [],
                "durability": "async",
                "replicas": None,
                "unavailable": {"far": down},
            }
            listing = httpx.get(f"{base}/v1/models", timeout=10)
            assert listing.status_code == 200, listing.text
            shown = {
                m["name"]: [(v["state"], v["reason"], v["workers"]) for v in m["versions"]]
                for m in listing.json()["models"]
            }
            assert shown == {"far": [("unavailable", down, 0)], "slow": [("ready", None, 1)]}
            status = httpx.get(f"{base}/v1/status", timeout=10)
            assert status.status_code == 200, status.text
            assert {m["name"]: m["unavailable"] for m in status.json()["models"]} == {
                "far": "its Redis is unavailable: Redis cannot be reached",
                "slow": None,
            }
            scraped = httpx.get(f"{base}/metrics", timeout=10)
            assert scraped.status_code == 200, scraped.text
            assert 'inferq_model_unavailable{model="far",version="1"} 1.0' in scraped.text
            assert 'inferq_model_unavailable{model="slow",version="1"} 0.0' in scraped.text
            assert 'inferq_workers{model="slow",state="idle",version="1"} 1.0' in scraped.text
            v2 = httpx.get(f"{base}/v2/health/ready", timeout=10)
            assert (v2.status_code, v2.json()) == (200, {"ready": True})
            served = _post(base, "slow", 1.0, wait=True)
            assert served.status_code == 200 and served.json()["result"] == {"output": [1.0, 1.0]}, served.text
            refused = _post(base, "far", 1.0)
            assert refused.status_code == 503, refused.text
            b.start()  # back: its worker and webhook sender, started with the rest, take it up
            far = wait_for(lambda: _post(base, "far", 2.0, wait=True), lambda r: r.status_code == 200)
            assert far.json()["result"] == {"output": [2.0, 2.0]}, far.text
            wait_for(lambda: httpx.get(f"{base}/readyz", timeout=10), lambda r: r.json()["status"] == "ready")
    finally:
        b.stop()
    said = (tmp_path / "up.log").read_text()
    assert (
        "Redis b is unavailable: its models (far) and its webhook sender start and wait for it, the rest serve; what "
        "a run that did not stop left in it is cleared once it answers"
    ) in said
    assert "Traceback" not in said
