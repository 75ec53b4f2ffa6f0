"""Tenants (INFERQ_TENANTS): each key's name, weight and quotas, a jobs-per-minute quota held across API processes
with 429 and Retry-After and nothing of a refused job in Redis, and GET /v1/tenants/me."""

from __future__ import annotations

import hashlib
import json
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from inferq.client import Client
from inferq.shared.redis_server import free_port
from tests.support.stack import Stack, _ready, new_stack, serving
from tests.support.waiting import wait_until

TENANTS = [
    {"name": "acme", "key": "key-acme", "weight": 3, "quotas": {"jobs_per_minute": 4}},
    # Stored as its hash only (a Kubernetes Secret need not hold the key itself).
    {"name": "beta", "key_sha256": hashlib.sha256(b"key-beta").hexdigest()},
    {"name": "ops", "key": "key-ops", "operator": True},  # sees every tenant
]


def _second_api(stack: Stack) -> str:
    """Another API process on the same Redis, answering: its base URL (a quota must hold across both)."""
    other = f"http://127.0.0.1:{free_port()}"
    stack.start("api", "--port", other.rsplit(":", 1)[1], name="api2")
    wait_until(lambda: _ready(other), 30, "the second API")
    return other


def _as(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def test_a_tenant_over_its_jobs_per_minute_quota_gets_429_across_two_api_processes_and_nothing_enters_redis(
    tmp_path: Path,
) -> None:
    tenants_file = tmp_path / "tenants.json"
    tenants_file.write_text(json.dumps(TENANTS))
    stack = new_stack(tmp_path, INFERQ_TENANTS=f"@{tenants_file}", INFERQ_API_KEYS="key-plain")
    with serving(stack):
        stack.start_api()
        other = _second_api(stack)
        bases = [stack.base, other]
        redis = stack.redis()

        def submit(base: str, key: str) -> httpx.Response:
            return httpx.post(f"{base}/v1/models/slow/jobs", json={"inputs": [1, 2]}, headers=_as(key), timeout=10)

        # No worker: every accepted job waits in the queue, where it can be counted.
        accepted = [submit(bases[n % 2], "key-acme") for n in range(4)]
        assert [r.status_code for r in accepted] == [202] * 4, [r.text for r in accepted]
        jobs_before = sorted(redis.scan_iter("rq:job:*"))
        refused = [submit(bases[n % 2], "key-acme") for n in range(3)]
        assert {r.status_code for r in refused} == {429}
        for response in refused:
            error = response.json()["error"]
            assert error["code"] == "quota_exceeded" and "jobs_per_minute" in error["message"], error
            assert "key-acme" not in response.text
            assert 1 <= int(response.headers["Retry-After"]) <= 15  # one job's share of the minute: 60/4 s
        oip = httpx.post(
            f"{other}/v2/models/slow/infer",
            json={"inputs": [{"name": "tensor", "shape": [2], "datatype": "FP32", "data": [1, 2]}]},
            headers=_as("key-acme") | {"Prefer": "respond-async"},
            timeout=10,
        )
        assert oip.status_code == 429 and "Retry-After" in oip.headers, oip.text
        # Nothing of a refused job was written: the queue and the job hashes are as they were.
        assert sorted(redis.scan_iter("rq:job:*")) == jobs_before
        assert redis.llen("rq:queue:inferq.slow") == 4
        # The other tenants have quotas of their own (none here): untouched by acme's.
        assert [submit(base, "key-beta").status_code for base in bases * 3] == [202] * 6
        assert submit(stack.base, "key-plain").status_code == 202
        assert submit(stack.base, "key-unknown").status_code == 401

        me = httpx.get(f"{other}/v1/tenants/me", headers=_as("key-acme"), timeout=10).json()
        assert (me["name"], me["weight"], me["quotas"]["jobs_per_minute"]) == ("acme", 3.0, 4), me
        use = me["use"]["jobs_per_minute"]
        assert (use["limit"], use["used"]) == (4, 4) and use["retry_after_s"] >= 1, me
        beta = httpx.get(f"{stack.base}/v1/tenants/me", headers=_as("key-beta"), timeout=10).json()
        assert (beta["name"], beta["weight"], set(beta["use"].values())) == ("beta", 1.0, {None}), beta
        plain = httpx.get(f"{stack.base}/v1/tenants/me", headers=_as("key-plain"), timeout=10).json()
        assert plain["name"] == "key-" + hashlib.sha256(b"key-plain").hexdigest()[:8]
        assert httpx.get(f"{stack.base}/v1/tenants/me", timeout=10).status_code == 401
        # The status page: a tenant's key sees itself alone, an operator's every tenant, by name only.
        mine = httpx.get(f"{stack.base}/v1/status", headers=_as("key-beta"), timeout=10).json()
        assert [(t["name"], t["in_flight"]) for t in mine["tenants"]] == [("beta", 6)]
        status = httpx.get(f"{stack.base}/v1/status", headers=_as("key-ops"), timeout=10).json()
        by_name = {t["name"]: t for t in status["tenants"]}
        assert set(by_name) == {"acme", "beta", "ops", plain["name"]} and "key-acme" not in json.dumps(status)
        assert by_name["acme"]["use"]["jobs_per_minute"]["used"] == 4 and by_name["acme"]["weight"] == 3.0
        # No worker: every job each one sent still waits (the status page's "waiting or running").
        assert [by_name[n]["in_flight"] for n in ("acme", "beta", plain["name"])] == [4, 6, 1], by_name
        with Client(stack.base, api_key="key-acme") as client:  # the SDK reads the same
            tenant = client.tenant()
        assert (tenant.name, tenant.quotas["jobs_per_minute"], tenant.use["jobs_per_minute"]["used"]) == ("acme", 4, 4)
        # Every key the quota wrote expires (it is gone once the tenant is back to a full burst).
        assert 0 < redis.pttl("inferq:tenant:acme:rate") <= 60_000
        # Nothing an API logs names a key.
        logs = "".join(p.read_text() for p in stack.logs)
        assert "4 tenant(s) (INFERQ_TENANTS, INFERQ_API_KEYS): acme, beta, ops, key-" in logs  # names only
        assert "; operators: ops; " in logs
        assert "key-acme" not in logs and "key-beta" not in logs and "key-plain" not in logs and "key-ops" not in logs


def test_without_keys_everything_is_one_tenant_with_no_quota(tmp_path: Path) -> None:
    stack = new_stack(tmp_path)
    with serving(stack):
        stack.start_api()
        me = httpx.get(f"{stack.base}/v1/tenants/me", timeout=10).json()
        assert me == {"name": "default", "weight": 1.0, "quotas": me["quotas"], "use": dict.fromkeys(me["use"])}
        assert set(me["quotas"].values()) == {None}


def _fair_stack(tmp_path: Path, weights: dict[str, float], slow_s: float = 0.02) -> tuple[Stack, dict[str, str]]:
    tenants = [{"name": name, "key": f"key-{name}", "weight": weight} for name, weight in weights.items()]
    tenants.append({"name": "ops", "key": "key-ops", "operator": True})  # reads /metrics by tenant; sends nothing
    stack = new_stack(tmp_path, INFERQ_TENANTS=json.dumps(tenants), INFERQ_TEST_SLOW_S=str(slow_s))
    return stack, {name: f"key-{name}" for name in weights}


WINDOW_S = 10.0


@pytest.mark.parametrize(
    ("weights", "queued", "heavy_share"),
    [({"a": 1, "b": 1}, {"a": 480, "b": 480}, 0.5), ({"a": 3, "b": 1}, {"a": 720, "b": 480}, 0.75)],
)
def test_backlogged_tenants_get_completions_by_their_weights_in_every_10_s_window_whoever_queued_first(
    tmp_path: Path, weights: dict[str, float], queued: dict[str, int], heavy_share: float
) -> None:
    """Tenant a queues its whole backlog first, then b; the model takes 0.2 s a batch of 8, so both stay backlogged
    for at least 960 completions, 24 s. In every 10 s window (by the jobs' end times) while both wait, a gets its
    weight's share of the completions ± 5 %; b's first job runs in the first batches, not after a's."""
    stack, keys_of = _fair_stack(tmp_path, weights, slow_s=0.2)
    with serving(stack):
        stack.start_api()
        url = f"{stack.base}/v1/models/slow/jobs"
        owner: dict[str, str] = {}
        with httpx.Client(timeout=10) as client:
            for tenant, count in queued.items():
                for n in range(count):
                    value = n % 100  # never the model's poison value (666)
                    response = client.post(url, json={"inputs": [value, value]}, headers=_as(keys_of[tenant]))
                    assert response.status_code == 202, response.text
                    owner[response.json()["id"]] = tenant
        # The RQ list holds the fair order's first 1,000 (rq info counts them), its fair backlog the rest.
        total, redis = sum(queued.values()), stack.redis()
        listed, waiting = redis.llen("rq:queue:inferq.slow"), redis.zcard("inferq:fair:inferq.slow:backlog")
        assert (listed, waiting) == (min(total, 1000), max(0, total - 1000))
        stack.start_worker("slow")

        def views() -> list[dict[str, Any]]:
            with httpx.Client(timeout=10) as client:
                return [
                    client.get(f"{stack.base}/v1/jobs/{i}", headers=_as(keys_of[t])).json() for i, t in owner.items()
                ]

        wait_until(lambda: {v["status"] for v in views()} == {"finished"}, 300, "every job to finish")
        done = views()
        ended = sorted((datetime.fromisoformat(v["ended_at"]), owner[v["id"]]) for v in done)
        ran = [owner[v["id"]] for v in sorted(done, key=lambda v: (v["started_at"], v["id"]))]
        # Both wait until the first of them has its last job done.
        both_until = min(max(at for at, t in ended if t == tenant) for tenant in queued)
        first = ended[0][0]
        windows = 0
        while first + timedelta(seconds=WINDOW_S * (windows + 1)) <= both_until:
            start = first + timedelta(seconds=WINDOW_S * windows)
            stop = start + timedelta(seconds=WINDOW_S)
            inside = [tenant for at, tenant in ended if start <= at < stop]
            share = inside.count("a") / len(inside)
            assert abs(share - heavy_share) <= 0.05, (windows, len(inside), share)
            windows += 1
        # 0.2 s a batch of 8 is at most 40 completions a second: 960 while both wait take 24 s at least.
        assert windows >= 2, (first, both_until)
        assert "b" in ran[:16]
        # /metrics counts each tenant's jobs under its configured name, and no other tenant label (to an operator's
        # key: a scrape without one sees each model whole).
        text = httpx.get(f"{stack.base}/metrics", headers=_as("key-ops"), timeout=10).text
        counted = {
            sample.labels["tenant"]: sample.value
            for family in text_string_to_metric_families(text)
            for sample in family.samples
            if sample.name == "inferq_jobs_ended_total" and sample.labels["model"] == "slow"
            if sample.labels["status"] == "finished"
        }
        assert counted == {"default": 0.0, **{t: float(n) for t, n in queued.items()}}, counted


def test_a_worker_killed_mid_batch_of_mixed_tenants_loses_nothing(tmp_path: Path) -> None:
    stack, keys_of = _fair_stack(tmp_path, {"a": 1, "b": 1})
    with serving(stack):
        stack.start_api()
        url = f"{stack.base}/v1/models/slow/jobs"
        owner = {}
        for n in range(12):
            for tenant in ("a", "b") if n < 4 else ("a",):
                response = httpx.post(url, json={"inputs": [n, n]}, headers=_as(keys_of[tenant]), timeout=10)
                owner[response.json()["id"]] = tenant

        def statuses() -> dict[str, str]:
            return {
                i: httpx.get(f"{stack.base}/v1/jobs/{i}", headers=_as(keys_of[t]), timeout=10).json()["status"]
                for i, t in owner.items()
            }

        doomed = stack.start_worker("slow", name="doomed", env={"INFERQ_TEST_SLOW_S": "30"})
        wait_until(lambda: "started" in statuses().values(), 60, "a batch to start")
        started = [i for i, s in statuses().items() if s == "started"]
        assert {owner[i] for i in started} == {"a", "b"}  # the batch mixes both tenants
        doomed.kill()
        doomed.wait()
        stack.start_worker("slow", name="after", env={"INFERQ_TEST_SLOW_S": "0"})
        wait_until(lambda: set(statuses().values()) == {"finished"}, 180, "every job, the killed batch's too")


def test_a_tenant_at_its_in_flight_quota_is_refused_until_one_of_its_jobs_ends(tmp_path: Path) -> None:
    """Across two API processes: three jobs not yet ended fill the quota; a fourth is 429 and writes nothing; once one
    ends (here canceled), the next is taken."""
    tenants = [
        {"name": "acme", "key": "key-acme", "quotas": {"in_flight": 3}},
        {"name": "beta", "key": "key-beta"},
    ]
    stack = new_stack(tmp_path, INFERQ_TENANTS=json.dumps(tenants))
    with serving(stack):
        stack.start_api()
        other = _second_api(stack)
        redis = stack.redis()

        def submit(base: str, key: str = "key-acme") -> httpx.Response:
            return httpx.post(f"{base}/v1/models/slow/jobs", json={"inputs": [1, 2]}, headers=_as(key), timeout=10)

        ids = [submit(base).json()["id"] for base in (stack.base, other, stack.base)]  # no worker: they wait
        jobs_before = sorted(redis.scan_iter("rq:job:*"))
        refused = submit(other)
        assert refused.status_code == 429, refused.text
        error = refused.json()["error"]
        assert error["code"] == "quota_exceeded" and "in_flight" in error["message"], error
        assert refused.headers["Retry-After"] == "1"
        assert sorted(redis.scan_iter("rq:job:*")) == jobs_before
        assert submit(stack.base, "key-beta").status_code == 202  # another tenant's own count
        me = httpx.get(f"{other}/v1/tenants/me", headers=_as("key-acme"), timeout=10).json()
        assert me["use"]["in_flight"] == {"limit": 3, "used": 3}, me
        cancel = httpx.post(f"{stack.base}/v1/jobs/{ids[0]}/cancel", headers=_as("key-acme"), timeout=10)
        assert cancel.status_code == 200, cancel.text

        def taken() -> bool:  # at most one look a second per API process at which counted jobs ended
            return submit(other).status_code == 202

        wait_until(taken, 10, "a submit once one of the three ended")
        assert submit(other).status_code == 429  # three again
        assert redis.pttl("inferq:tenant:acme:in-flight") > 0


def _lines(count: int, tag: str) -> bytes:
    return b"".join(json.dumps({"custom_id": f"{tag}{n}", "inputs": [1, 2]}).encode() + b"\n" for n in range(count))


def test_a_tenant_past_its_bulk_lines_quota_is_refused_and_its_refused_upload_leaves_nothing(tmp_path: Path) -> None:
    tenants = [{"name": "acme", "key": "key-acme", "quotas": {"bulk_lines": 10}}, {"name": "beta", "key": "key-beta"}]
    stack = new_stack(tmp_path, INFERQ_TENANTS=json.dumps(tenants))
    with serving(stack):
        stack.start_api()
        other = _second_api(stack)
        redis = stack.redis()

        def upload(base: str, count: int, tag: str, key: str = "key-acme") -> httpx.Response:
            return httpx.post(
                f"{base}/v1/models/slow/batches",
                content=_lines(count, tag),
                headers=_as(key) | {"content-type": "application/jsonl"},
                timeout=30,
            )

        first = upload(stack.base, 8, "a")  # no worker: its lines wait
        assert first.status_code == 202, first.text
        keys_before = sorted(k for k in redis.scan_iter("*") if not k.startswith(b"inferq:tenant:"))
        over = upload(other, 5, "b")  # 8 + 5 > 10: refused when it is queued, once read
        assert over.status_code == 429, over.text
        error = over.json()["error"]
        assert error["code"] == "quota_exceeded" and "bulk_lines" in error["message"], error
        assert over.headers["Retry-After"] == "10"
        assert sorted(k for k in redis.scan_iter("*") if not k.startswith(b"inferq:tenant:")) == keys_before
        assert upload(other, 2, "c").status_code == 202  # 10: the quota, not past it
        early = upload(stack.base, 1, "d")  # at the quota: refused before a line is read
        assert early.status_code == 429 and "10 of its 10" in early.json()["error"]["message"], early.text
        assert upload(stack.base, 5, "e", key="key-beta").status_code == 202  # another tenant's own count
        me = httpx.get(f"{other}/v1/tenants/me", headers=_as("key-acme"), timeout=10).json()
        assert me["use"]["bulk_lines"] == {"limit": 10, "used": 10}, me
        canceled = httpx.post(first.json()["urls"]["cancel"], headers=_as("key-acme"), timeout=10)
        assert canceled.status_code == 200, canceled.text
        assert upload(other, 5, "f").status_code == 202  # the canceled batch's lines no longer count
        assert redis.ttl("inferq:tenant:acme:bulk-lines") > 0


def test_a_tenants_bulk_work_keeps_running_while_another_saturates_the_interactive_lane(tmp_path: Path) -> None:
    """B's 3,000 interactive items (uploaded to the interactive lane) keep the worker busy for its whole run; A's bulk
    upload still gets its share of the batches (INFERQ_BULK_SHARE) and ends while B's work still waits."""
    stack, keys_of = _fair_stack(tmp_path, {"a": 1, "b": 1})
    stack.env["INFERQ_TEST_SLOW_S"] = "0.05"
    with serving(stack):
        stack.start_api()

        def upload(tenant: str, count: int, priority: str) -> dict[str, Any]:
            response = httpx.post(
                f"{stack.base}/v1/models/slow/batches",
                params={"priority": priority},
                content=_lines(count, tenant),
                headers=_as(keys_of[tenant]) | {"content-type": "application/jsonl"},
                timeout=60,
            )
            assert response.status_code == 202, response.text
            return dict(response.json())

        saturating = upload("b", 3000, "interactive")
        bulk = upload("a", 200, "bulk")
        stack.start_worker("slow")

        def read(batch: dict[str, Any], tenant: str) -> dict[str, Any]:
            return dict(httpx.get(batch["urls"]["self"], headers=_as(keys_of[tenant]), timeout=10).json())

        wait_until(lambda: read(bulk, "a")["status"] == "finished", 120, "A's bulk batch to end")
        assert read(bulk, "a")["counts"]["finished"] == 200
        b_now = read(saturating, "b")
        assert b_now["status"] != "finished" and b_now["counts"]["queued"] > 0, b_now  # B still saturates the worker
