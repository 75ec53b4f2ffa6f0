"""KEDA's Redis scaler against a real stack: the ScaledObjects in deploy/kubernetes wake a worker for a job
submitted at zero workers, and stay active while a killed last worker's batch waits to be run again."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import yaml

from tests.support.manifests import K8S, scaled_object_for
from tests.support.models import ROOT
from tests.support.stack import Stack, new_stack, serving
from tests.support.waiting import wait_until

# The script KEDA v2.20.2's Redis scaler runs for each trigger (pkg/scalers/redis_scaler.go): the
# length of the key whatever its type. A trigger is active while the count is above its
# activationListLength; KEDA keeps at least one replica while any trigger is active.
KEDA_REDIS_COUNT = """
local listName = KEYS[1]
local listType = redis.call('type', listName).ok
if listType == 'zset' then
    return redis.call('zcard', listName)
elseif listType == 'set' then
    return redis.call('scard', listName)
elseif listType == 'hash' then
    return redis.call('hlen', listName)
elseif listType == 'list' or listType == 'none' then
    return redis.call('llen', listName)
else
    return redis.error_reply('ERR unsupported key type: ' .. listType)
end
"""


def _keda_counts(client: Any, scaled: dict[str, Any]) -> dict[str, int]:
    """What each trigger of the ScaledObject reads from this Redis."""
    counts = {}
    for trigger in scaled["spec"]["triggers"]:
        assert int(trigger["metadata"]["databaseIndex"]) == client.connection_pool.connection_kwargs.get("db", 0)
        counts[trigger["name"]] = int(client.eval(KEDA_REDIS_COUNT, 1, trigger["metadata"]["listName"]))
    return counts


def _keda_active(counts: dict[str, int], scaled: dict[str, Any]) -> bool:
    limits = {t["name"]: int(t["metadata"]["activationListLength"]) for t in scaled["spec"]["triggers"]}
    return any(count > limits[name] for name, count in counts.items())


def _scaled_object_copied_for(model: str) -> dict[str, Any]:
    """worker-digits.yaml's ScaledObject copied for another model, as its header comment says to."""
    text = (K8S / "worker-digits.yaml").read_text().replace("digits", model)
    (scaled,) = [doc for doc in yaml.safe_load_all(text) if doc["kind"] == "ScaledObject"]
    return scaled


@pytest.fixture(scope="module")
def no_workers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """The API and Redis; workers start inside each test, as KEDA would start them."""
    # A short heartbeat so that a killed worker's batch is taken back in seconds, not a minute.
    env = {"INFERQ_HEARTBEAT_TTL_S": "3", "INFERQ_MAINTENANCE_INTERVAL_S": "1"}
    with serving(new_stack(tmp_path_factory.mktemp("keda"), **env)) as running:
        running.start_api()
        yield running


def _status(stack: Stack, job_id: str) -> str:
    response = httpx.get(f"{stack.base}/v1/jobs/{job_id}", timeout=10)
    assert response.status_code == 200, response.text
    status = response.json()["status"]
    assert isinstance(status, str)
    return status


def test_a_job_submitted_at_zero_workers_wakes_keda_and_runs_when_a_worker_starts(no_workers: Stack) -> None:
    scaled = scaled_object_for("digits")
    client = no_workers.redis()
    try:
        assert _keda_counts(client, scaled) == dict.fromkeys(_keda_counts(client, scaled), 0)
        assert not _keda_active(_keda_counts(client, scaled), scaled)  # zero workers is where KEDA rests
        ids = []
        for digit in (3, 7):
            with (ROOT / "samples" / "digits" / f"{digit}.png").open("rb") as image:
                response = httpx.post(f"{no_workers.base}/v1/models/digits/jobs", files={"file": image}, timeout=10)
            assert response.status_code == 202, response.text
            ids.append(response.json()["id"])
        assert "digits" in httpx.get(f"{no_workers.base}/readyz").json()["models_without_workers"]
        counts = _keda_counts(client, scaled)
        assert counts == {
            "interactive": 2,
            "bulk": 0,
            "interactive-started": 0,
            "bulk-started": 0,
            "interactive-backlog": 0,  # one tenant: no fair order, no backlog
            "bulk-backlog": 0,
        }
        assert _keda_active(counts, scaled)  # KEDA starts the first worker
        assert [_status(no_workers, job_id) for job_id in ids] == ["queued", "queued"]

        worker = no_workers.start_worker("digits", name="keda-digits")
        wait_until(lambda: [_status(no_workers, i) for i in ids] == ["finished"] * 2, 60, "the jobs to finish")
        labels = [httpx.get(f"{no_workers.base}/v1/jobs/{i}").json()["result"]["label"] for i in ids]
        assert labels == ["3", "7"]
        # Nothing waits or runs: after cooldownPeriod KEDA takes the worker away again.
        assert not _keda_active(_keda_counts(client, scaled), scaled)
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(timeout=30) == 0
    finally:
        client.close()


def test_a_killed_last_workers_batch_keeps_keda_active_until_another_worker_runs_it(no_workers: Stack) -> None:
    scaled = _scaled_object_copied_for("slow")
    client = no_workers.redis()
    try:
        ids = []
        for i in range(2):
            response = httpx.post(f"{no_workers.base}/v1/models/slow/jobs", json={"inputs": [i, i]}, timeout=10)
            assert response.status_code == 202, response.text
            ids.append(response.json()["id"])
        doomed = no_workers.start_worker("slow", name="doomed", env={"INFERQ_TEST_SLOW_S": "30"})
        wait_until(lambda: [_status(no_workers, i) for i in ids] == ["started"] * 2, 60, "the batch to start")
        # The queue is empty while the batch runs: only the started registry keeps the worker up.
        assert _keda_counts(client, scaled) == {
            "interactive": 0,
            "bulk": 0,
            "interactive-started": 2,
            "bulk-started": 0,
            "interactive-backlog": 0,
            "bulk-backlog": 0,
        }
        doomed.send_signal(signal.SIGKILL)
        doomed.wait()
        # No worker left, the queue still empty: without the started triggers KEDA would stay at zero.
        counts = _keda_counts(client, scaled)
        assert counts["interactive"] == 0 and counts["interactive-started"] == 2
        assert _keda_active(counts, scaled)
        no_workers.start_worker("slow", name="revived")
        wait_until(lambda: [_status(no_workers, i) for i in ids] == ["finished"] * 2, 60, "the retried batch")
        assert not _keda_active(_keda_counts(client, scaled), scaled)
    finally:
        client.close()
