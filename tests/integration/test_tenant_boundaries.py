"""What each API key may see and do (real redis-server, the API through httpx.ASGITransport, in-process workers):
only an operator's key changes what every tenant gets; a tenant's key sees of the tenants only its own row and its
own jobs' failures on /v1/status; /metrics names tenants only to an operator's key; and a caller without a key
cannot tell a known model from an unknown one."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
import redis as redis_py
from prometheus_client.parser import text_string_to_metric_families

from inferq.shared import keys
from inferq.shared.lifecycle import claims
from inferq.shared.rqjson import JSONJob
from inferq.shared.settings import Settings
from inferq.workers.batching import BatchWorker
from tests.support.asgi import call_api
from tests.support.echo import JSONL, POISON, echo_runner

ECHO = {"handler": "tests.support.echo:SlowEcho", "weights": "none", "input": {"kind": "tensor", "shape": [2]}}
TENANTS = [
    {"name": "acme", "key": "key-acme", "weight": 3, "quotas": {"in_flight": 50}},
    {"name": "beta", "key": "key-beta"},
    {"name": "ops", "key": "key-ops", "operator": True},
]
ACME, BETA, OPS = ({"Authorization": f"Bearer key-{name}"} for name in ("acme", "beta", "ops"))
FORBIDDEN = {
    "error": {
        "code": "forbidden",
        "message": "tenant beta may not do this: a model's rollout, a version's restore and a reload of the models"
        ' change what every tenant gets, and need an operator\'s key (a tenant with "operator": true in'
        " INFERQ_TENANTS)",
    }
}
UNAUTHORIZED = {
    "error": {"code": "unauthorized", "message": "a valid API key is required: Authorization: Bearer <key>"}
}


def _settings(
    models_dir: Path, redis_url: str, tenants: list[dict[str, Any]] | None = TENANTS, versions: int = 1
) -> Settings:
    """The echo model, in ``versions`` versions (no worker unless a test runs one)."""
    (models_dir / "echo").mkdir()
    (models_dir / "echo" / "config.json").write_text(json.dumps(ECHO))
    for version in range(1, versions + 1) if versions > 1 else ():
        (models_dir / "echo" / str(version)).mkdir()
    return Settings(redis_url=redis_url, models_dir=models_dir, tenants=json.dumps(tenants) if tenants else None)


@pytest.fixture
def settings(tmp_path: Path, redis_url: str) -> Settings:
    return _settings(tmp_path, redis_url)


OPERATOR_ROUTES: list[tuple[str, str, dict[str, Any]]] = [
    ("PUT", "/v1/models/echo/rollout", {"json": {"traffic": {"2": 100}}}),
    ("DELETE", "/v1/models/echo/rollout", {}),
    ("POST", "/v1/models/echo/versions/1/restore", {}),
    ("POST", "/v1/models/reload", {}),
    ("PUT", "/v1/models/nosuch/rollout", {"json": {"traffic": {"2": 100}}}),  # 403 before any model is looked up
]


def test_only_an_operators_key_sets_a_rollout_restores_a_version_or_reloads_the_models(
    tmp_path: Path, redis_url: str, redis: redis_py.Redis
) -> None:
    """beta's key was answered 200 by PUT .../rollout, and every tenant's unpinned jobs then followed it."""
    settings = _settings(tmp_path, redis_url, versions=2)
    as_beta = call_api(
        settings, *((method, path, {**kwargs, "headers": BETA}) for method, path, kwargs in OPERATOR_ROUTES)
    )
    assert [(r.status_code, r.json()) for r in as_beta] == [(403, FORBIDDEN)] * len(OPERATOR_ROUTES)
    assert redis.exists(keys.rollout_key("echo")) == 0  # nothing of it was stored
    anonymous = call_api(settings, *((method, path, kwargs) for method, path, kwargs in OPERATOR_ROUTES))
    assert [(r.status_code, r.json()) for r in anonymous] == [(401, UNAUTHORIZED)] * len(OPERATOR_ROUTES)

    as_ops = call_api(
        settings, *((method, path, {**kwargs, "headers": OPS}) for method, path, kwargs in OPERATOR_ROUTES)
    )
    assert [r.status_code for r in as_ops] == [200, 200, 404, 200, 404], [r.text for r in as_ops]
    assert as_ops[0].json()["rollout"] == {
        "traffic": {"2": 100.0},
        "ramp": None,
        "set_by": "api",
        "ramp_started_at": None,
        "unusable": None,
    }
    assert as_ops[1].json()["rollout"]["set_by"] == "config"
    assert as_ops[2].json()["error"]["message"] == "version 1 of model echo is not rolled back"
    # A tenant still reads the models, and what its own key may do is unchanged.
    models, me = call_api(
        settings, ("GET", "/v1/models/echo", {"headers": BETA}), ("GET", "/v1/tenants/me", {"headers": BETA})
    )
    assert models.status_code == 200 and me.json()["name"] == "beta"


def test_without_keys_anyone_is_the_operator_as_before(tmp_path: Path, redis_url: str) -> None:
    """The default, no tenants: every route stays open (the API must then not be exposed: docs/operating.md)."""
    settings = _settings(tmp_path, redis_url, tenants=None, versions=2)
    answers = call_api(settings, *OPERATOR_ROUTES)
    assert [r.status_code for r in answers] == [200, 200, 404, 200, 404], [r.text for r in answers]
    assert answers[4].json()["error"]["message"] == "no model 'nosuch'; GET /v1/models lists them"


def _ran(redis: redis_py.Redis, settings: Settings) -> None:
    BatchWorker({"echo": echo_runner(16)}, connection=redis, settings=settings, name=f"w{time.time_ns()}").work(
        burst=True
    )


def _submit(settings: Settings, *sent: tuple[dict[str, str], float]) -> list[str]:
    answers = call_api(
        settings,
        *(
            ("POST", "/v1/models/echo/jobs", {"json": {"inputs": [value, value]}, "headers": key})
            for key, value in sent
        ),
    )
    assert [r.status_code for r in answers] == [202] * len(sent), [r.text for r in answers]
    return [r.json()["id"] for r in answers]


def test_a_tenants_key_sees_only_its_own_row_and_its_own_jobs_failures_on_the_status_page(
    settings: Settings, redis: redis_py.Redis
) -> None:
    """beta's key read acme's name, weight, quotas, use and throughput, and acme's failed jobs' error texts."""
    _, _, expired, died = _submit(settings, (ACME, POISON), (ACME, 1.0), (ACME, 2.0), (ACME, 3.0))
    _submit(settings, (BETA, POISON), (BETA, 4.0))
    redis.delete(JSONJob.key_for(expired))  # RQ's queue TTL ended its hash at its deadline
    redis.hset(keys.info_key(expired), "deadline", f"{time.time() - 1:.3f}")
    redis.hset(JSONJob.key_for(died), "status", "failed")  # as RQ's maintenance leaves a dead worker's job
    assert claims.announce_failed(redis, settings, [died]) == [died]
    _ran(redis, settings)

    beta, acme, ops = (
        r.json() for r in call_api(settings, *(("GET", "/v1/status", {"headers": k}) for k in (BETA, ACME, OPS)))
    )
    echo = _model(beta, "echo")
    assert [t["name"] for t in beta["tenants"]] == ["beta"]
    assert beta["tenants"][0]["ended_total"] == {"finished": 1.0, "failed": 1.0}
    assert [(f["reason"], f["tenant"]) for f in echo["failures"]] == [("ModelError", "beta")]
    assert "acme" not in json.dumps(beta)
    # The model as a whole, as /metrics shows anyone: every tenant's jobs count in it.
    assert echo["ended_total"] == {"finished": 2.0, "failed": 3.0, "expired": 1.0}

    assert [t["name"] for t in acme["tenants"]] == ["acme"]
    assert acme["tenants"][0]["quotas"]["in_flight"] == 50 and acme["tenants"][0]["weight"] == 3.0
    reasons = sorted((f["reason"], f["tenant"]) for f in _model(acme, "echo")["failures"])
    assert reasons == [("Expired", "acme"), ("ModelError", "acme"), ("WorkerDied", "acme")]
    assert "beta" not in json.dumps(acme)

    assert [t["name"] for t in ops["tenants"]] == ["acme", "beta", "ops"]
    told = sorted((f["reason"], f["tenant"]) for f in _model(ops, "echo")["failures"])
    assert told == sorted(reasons + [("ModelError", "beta")])


def _model(status: dict[str, Any], name: str) -> dict[str, Any]:
    return next(model for model in status["models"] if model["name"] == name)


def _per_job_samples(text: str) -> dict[tuple[tuple[str, str], ...], float]:
    return {
        tuple(sorted(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "inferq_jobs_ended_total" and sample.labels["status"] == "finished"
    }


def test_metrics_names_the_tenants_only_to_an_operators_key(settings: Settings, redis: redis_py.Redis) -> None:
    """/metrics, open by design, named every tenant to anyone: its per-job families carried the tenant label."""
    _submit(settings, (ACME, 1.0), (ACME, 2.0), (BETA, 3.0))
    _ran(redis, settings)
    scrapes = call_api(
        settings, *(("GET", "/metrics", {"headers": k}) for k in ({}, BETA, {"Authorization": "Bearer wrong"}, OPS))
    )
    assert [r.status_code for r in scrapes] == [200] * 4
    whole = {(("model", "echo"), ("status", "finished"), ("version", "1")): 3.0}
    for scrape in scrapes[:3]:  # no key, a tenant's own, an unknown one: the cluster as a whole
        assert _per_job_samples(scrape.text) == whole
        assert "acme" not in scrape.text and "beta" not in scrape.text
    by_tenant = _per_job_samples(scrapes[3].text)
    assert by_tenant == {
        (("model", "echo"), ("status", "finished"), ("tenant", name), ("version", "1")): value
        for name, value in (("acme", 2.0), ("beta", 1.0), ("default", 0.0))
    }


# Every route that takes a model by name, as a caller without a key calls it.
MODEL_ROUTES: list[tuple[str, str, dict[str, Any]]] = [
    ("POST", "/v1/models/{m}/jobs", {"json": {"inputs": [1, 2]}}),
    ("POST", "/v1/models/{m}/batches", {"content": b'{"custom_id": "a", "inputs": [1, 2]}\n', "headers": JSONL}),
    ("GET", "/v1/models/{m}", {}),
    ("GET", "/v2/models/{m}", {}),
    ("GET", "/v2/models/{m}/ready", {}),
    ("GET", "/v2/models/{m}/versions/1", {}),
    ("GET", "/v2/models/{m}/versions/1/ready", {}),
    ("POST", "/v2/models/{m}/infer", {"json": {"inputs": []}}),
    ("POST", "/v2/models/{m}/versions/1/infer", {"json": {"inputs": []}}),
]


def test_without_a_key_a_known_model_and_an_unknown_one_answer_the_same_401(settings: Settings) -> None:
    """The model was resolved before the caller: a known model answered 401, an unknown one 404."""
    asked = [
        (method, path.format(m=model), kwargs) for method, path, kwargs in MODEL_ROUTES for model in ("echo", "nosuch")
    ]
    answers = call_api(settings, *asked)
    for (method, path, _), answer in zip(asked, answers, strict=True):
        flat = {"error": UNAUTHORIZED["error"]["message"]}  # the protocol's own error body, under /v2
        told = flat if path.startswith("/v2") else UNAUTHORIZED
        assert (answer.status_code, answer.json()) == (401, told), (method, path)
        assert answer.headers["www-authenticate"] == "Bearer"
    # With a key, an unknown model is still a 404.
    with_key = [(m, p.format(m="nosuch"), {**kw, "headers": kw.get("headers", {}) | BETA}) for m, p, kw in MODEL_ROUTES]
    found = call_api(settings, *with_key)
    assert [r.status_code for r in found] == [404] * len(MODEL_ROUTES), [r.text for r in found]
