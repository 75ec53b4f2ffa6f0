"""A version's rollback judges the model, not its clients (shared/versions.py ``judge``, lua/judge.lua), on a real
Redis and a real batching worker: an item refused as bad input never counts, and with several tenants one tenant's
jobs alone cannot roll a version back for the others."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import redis as redis_py
import torch

from inferq.shared import keys
from inferq.shared.inputs.tensor import TensorInput
from inferq.shared.jobs import QueueCache, Submission, enqueue_job, get_job_view
from inferq.shared.models import ModelConfig, Rollback, Rollout
from inferq.shared.settings import Settings
from inferq.workers.batching import BatchWorker
from inferq.workers.running import ModelRunner
from tests.support.echo import POISON, SlowEcho

TENANTS = json.dumps([{"name": "acme", "key": "acme-key-1"}, {"name": "beta", "key": "beta-key-2"}])
# Version 1 of a model with two: judged, with a rollback of over 10 % of its last 50 jobs, from 20 on.
ROLLOUT = Rollout(traffic={1: 99, 2: 1}, rollback=Rollback(max_failure_rate=0.1, window=50, min_jobs=20))


def runner() -> ModelRunner:
    config = ModelConfig(
        name="echo",
        path=Path("."),
        handler="tests.support.echo:SlowEcho",
        input=TensorInput(shape=[2], dtype="float32"),
        max_batch=8,
        rollout=ROLLOUT,
    )
    handler = SlowEcho(config, torch.device("cpu"))
    handler.load()
    return ModelRunner(config, handler, torch.device("cpu"), 8, judged=True)


def submit(redis: redis_py.Redis, settings: Settings, inputs: object, tenant: str = "default") -> str:
    payload = json.dumps({"inputs": inputs}).encode()
    submission = Submission("echo", payload, "application/json", tenant=tenant)
    return enqueue_job(QueueCache(redis), settings, submission).id


def run_all(redis: redis_py.Redis, settings: Settings) -> None:
    BatchWorker({"echo": runner()}, connection=redis, settings=settings, name="judged").work(burst=True)


def test_inputs_refused_as_bad_never_count_against_the_version(redis: redis_py.Redis, redis_url: str) -> None:
    """Issue 45 item 16: 60 bad inputs (each refused by the handler, InvalidInput) rolled back the version that
    refused them, for everyone."""
    settings = Settings(redis_url=redis_url)
    bad = [submit(redis, settings, [1.0]) for _ in range(60)]  # one number where the model takes two
    good = [submit(redis, settings, [1.0, 2.0]) for _ in range(5)]
    run_all(redis, settings)
    assert {get_job_view(redis, i)["status"] for i in bad} == {"failed"}
    assert get_job_view(redis, bad[0])["error"] == "inputs: expected an array of length 2, got length 1"
    assert {get_job_view(redis, i)["status"] for i in good} == {"finished"}
    assert redis.exists(keys.rollback_key("echo")) == 0
    # The window holds the model's verdicts only: the five it ran.
    assert redis.lrange(keys.outcomes_key("echo"), 0, -1) == [b"0"] * 5


def test_one_tenants_failures_alone_never_roll_a_version_back(redis: redis_py.Redis, redis_url: str) -> None:
    """beta's inputs make the model fail (each passes the handler's checks); acme's run: the version stands."""
    settings = Settings(redis_url=redis_url, tenants=TENANTS)
    for _ in range(30):
        submit(redis, settings, [POISON, POISON], tenant="beta")
    for n in range(30):
        submit(redis, settings, [float(n), 1.0], tenant="acme")
    run_all(redis, settings)
    # Neither tenant holds more than half the window: beta's flood did not push acme's jobs out of it.
    window = redis.lrange(keys.outcomes_key("echo"), 0, -1)
    assert window == [b"0acme"] * 25 + [b"1beta"] * 25
    assert redis.exists(keys.rollback_key("echo")) == 0  # half of them failed, but none of acme's


@pytest.mark.parametrize("tenants", [TENANTS, None])
def test_a_version_that_fails_for_every_tenant_is_rolled_back(
    redis: redis_py.Redis, redis_url: str, tenants: str | None
) -> None:
    """The model fails for acme and beta alike (or, without tenants, for everyone): rolled back."""
    settings = Settings(redis_url=redis_url, tenants=tenants)
    for n in range(40):
        poison = n % 8 < 2  # a quarter of each tenant's jobs
        tenant = ("acme", "beta")[n % 2] if tenants else "default"
        submit(redis, settings, [POISON if poison else 1.0, 1.0], tenant=tenant)
    run_all(redis, settings)
    reason = redis.hget(keys.rollback_key("echo"), "reason")
    assert reason is not None
    # Judged from the 20th job on, after each batch of 8: rolled back at the batch that took it to 24; with tenants,
    # at the one that took it to 40, where each tenant's 20 jobs alone are enough to judge (min_jobs).
    allows = "more than the 10.0% its rollback allows"
    if tenants is None:
        assert reason.decode() == f"6 of its last 24 jobs failed (25.0%), {allows}"
    else:
        spread = "from 2 tenants, and without any one of them"
        assert reason.decode() == f"10 of its last 40 jobs failed (25.0%), {allows}, {spread}"
