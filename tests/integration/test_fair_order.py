"""Weighted fair order between tenants (lua/lib/fair.lua), on a real Redis: a tenant's backlog never makes another
wait behind it, batches mix backlogged tenants by their weights, and the RQ list stays the one queue."""

from __future__ import annotations

import json
from collections import Counter

import pytest
import redis as redis_py

from inferq.shared import keys
from inferq.shared.errors import QueueFull
from inferq.shared.jobs import QueueCache, Submission, cancel_job, enqueue_job, get_job_view, new_job_id
from inferq.shared.lifecycle import bulk, census, claims, layout
from inferq.shared.lifecycle.bulk import BulkItem, NewBatch
from inferq.shared.settings import Settings
from inferq.workers.batching import BatchWorker
from tests.support.echo import echo_runner

QUEUE = "rq:queue:inferq.echo"


@pytest.fixture
def settings(redis_url: str) -> Settings:
    return Settings(redis_url=redis_url)


def submit(redis: redis_py.Redis, settings: Settings, tenant: str, weight: float = 1.0, fair: bool = True) -> str:
    payload = json.dumps({"inputs": [1, 1]}).encode()
    submission = Submission("echo", payload, "application/json", tenant=tenant, fair=fair, weight=weight)
    return enqueue_job(QueueCache(redis), settings, submission).id


def order(redis: redis_py.Redis, owner: dict[str, str]) -> str:
    return "".join(owner[i.decode()] for i in redis.lrange(QUEUE, 0, -1))


def test_a_tenant_that_arrives_behind_a_backlog_is_served_next_not_last(
    redis: redis_py.Redis, settings: Settings
) -> None:
    owner = {submit(redis, settings, "a"): "a" for _ in range(100)}
    owner |= {submit(redis, settings, "b"): "b" for _ in range(5)}
    # b's jobs take their turns among a's from the head, as if both had been waiting all along: each of b's shares
    # its tag with one of a's (equal tags go in id order).
    served = order(redis, owner)
    assert [sorted(served[i : i + 2]) for i in range(0, 10, 2)] == [["a", "b"]] * 5 and served[10:12] == "aa"
    assert redis.llen(QUEUE) == 105  # rq info's count: one list, every job in it once
    owner |= {submit(redis, settings, "c"): "c" for _ in range(2)}
    assert order(redis, owner)[:16].count("c") == 2


def test_backlogged_tenants_share_by_their_weights_in_every_stretch_of_the_queue(
    redis: redis_py.Redis, settings: Settings
) -> None:
    owner = {}
    for _ in range(300):
        owner[submit(redis, settings, "heavy", weight=3)] = "h"
        owner[submit(redis, settings, "light", weight=1)] = "l"
    served = order(redis, owner)[:400]  # while both still wait
    for start in range(0, 400, 40):
        window = Counter(served[start : start + 40])
        assert window["h"] == 30, (start, window)


def test_a_worker_serves_the_fair_order_in_batches_that_mix_tenants(redis: redis_py.Redis, settings: Settings) -> None:
    a = [submit(redis, settings, "a") for _ in range(40)]
    b = [submit(redis, settings, "b") for _ in range(8)]
    cancel_job(QueueCache(redis), settings, a[1])  # a job that leaves from the middle is passed over later
    c = [submit(redis, settings, "c") for _ in range(4)]
    worker = BatchWorker({"echo": echo_runner(max_batch=8)}, connection=redis, settings=settings, name="fair")
    worker.work(burst=True)
    views = {i: get_job_view(redis, i) for i in a + b + c}
    assert {v["status"] for i, v in views.items() if i != a[1]} == {"finished"}
    assert views[a[1]]["status"] == "canceled"
    # In the order they ran (the batches' start times), b's and c's jobs all ran among the first 24, not after a's 40.
    ran = sorted((v["started_at"], i) for i, v in views.items() if i != a[1])
    first = {i for _, i in ran[:24]}
    assert set(b) | set(c) <= first, [("b" if i in b else "c" if i in c else "a") for _, i in ran]
    assert redis.llen(QUEUE) == 0


def test_with_one_tenant_the_queue_is_plain_fifo_and_writes_no_fair_keys(
    redis: redis_py.Redis, settings: Settings
) -> None:
    ids = [submit(redis, settings, "only", fair=False) for _ in range(10)]
    assert [i.decode() for i in redis.lrange(QUEUE, 0, -1)] == ids
    assert redis.keys("inferq:fair:*") == []


def test_fair_keys_expire_and_are_dropped_when_the_queue_empties(redis: redis_py.Redis, settings: Settings) -> None:
    for tenant in ("a", "b"):
        submit(redis, settings, tenant)
    for key in (keys.fair_tags_key("inferq.echo"), keys.fair_state_key("inferq.echo")):
        assert 0 < redis.ttl(key) <= settings.queue_ttl_s
    redis.delete(QUEUE)
    submit(redis, settings, "a")
    assert redis.zcard(keys.fair_tags_key("inferq.echo")) == 1  # the old tags went with the empty queue


def test_bulk_chunks_take_turns_by_the_items_they_carry(redis: redis_py.Redis, settings: Settings) -> None:
    """A big upload's chunks do not hold back a small one's: each chunk costs its items over its tenant's weight."""

    def upload(tenant: str, count: int, weight: float = 1.0) -> str:
        items = [
            BulkItem(f"{tenant}{i}", json.dumps({"inputs": [i, i]}).encode(), "application/json") for i in range(count)
        ]
        batch = NewBatch(new_job_id(), "echo", keys.BULK, 4, 600, items=items, tenant=tenant, fair=True, weight=weight)
        assert bulk.enqueue_batch(redis, settings, batch) == ("ok", "")
        return batch.id

    big, small = upload("a", 40), upload("b", 8)  # ten chunks of 4, then two
    chunks = [i.decode() for i in redis.lrange("rq:queue:inferq.echo.bulk", 0, -1)]
    owners = "".join("a" if keys.batch_of_chunk(c) == big else "b" for c in chunks)
    # Each of b's two chunks shares its tag with one of a's (equal tags go in id order).
    assert sorted(owners[:2]) == sorted(owners[2:4]) == ["a", "b"] and owners[4:] == "a" * 8, owners
    assert small in {keys.batch_of_chunk(c) for c in chunks}


def _calls(redis: redis_py.Redis, command: str) -> int:
    return int(redis.info("commandstats").get(f"cmdstat_{command}", {}).get("calls", 0))


def test_a_cancel_takes_its_job_out_of_the_fair_order(redis: redis_py.Redis, settings: Settings) -> None:
    """Issue 45 item 18: a canceled job left its tag, and a later submit tried each stale tag as its place in turn,
    reading the whole queue each time inside one script (63k of them held Redis 9.88 s)."""
    a = [submit(redis, settings, "a") for _ in range(500)]
    for job_id in a[1:401]:
        cancel_job(QueueCache(redis), settings, job_id)
    redis.config_resetstat()
    b = submit(redis, settings, "b")  # its place: beside a's first, the head (their tags are equal: in id order)
    assert _calls(redis, "linsert") == 1  # one place tried, the right one
    head = [i.decode() for i in redis.lrange(QUEUE, 0, 2)]
    assert sorted(head[:2]) == sorted([a[0], b]) and head[2] == a[401]
    tags = keys.fair_tags_key("inferq.echo")
    assert {m.decode() for m in redis.zrange(tags, 0, -1)} == {a[0], b, *a[401:]}


def test_a_placement_reads_at_most_the_lists_window_and_the_order_holds(
    redis: redis_py.Redis, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """However long the queue, the RQ list holds the first FAIR_WINDOW jobs of the fair order and the rest wait in
    its backlog: a LINSERT reads at most the window. Drained, the jobs come in fair order all the same."""
    monkeypatch.setattr(layout, "FAIR_WINDOW", 20, raising=False)
    weights = {"a": 1.0, "b": 2.0, "c": 0.5}
    owner: dict[str, str] = {}
    tag: dict[str, float] = {}
    ends = dict.fromkeys(weights, 0.0)
    sequence = ["a"] * 60 + ["b", "c"] * 40 + ["a", "b"] * 30  # no claims meanwhile: every start is its tenant's end
    for tenant in sequence:
        job_id = submit(redis, settings, tenant, weight=weights[tenant])
        owner[job_id], tag[job_id] = tenant, ends[tenant]
        ends[tenant] += 1 / weights[tenant]
        assert redis.llen(QUEUE) <= 20
    backlog = keys.fair_backlog_key("inferq.echo")
    assert redis.llen(QUEUE) == 20 and redis.zcard(backlog) == len(sequence) - 20
    assert census.read_cluster(redis, ["echo"]).models["echo"].depth[keys.INTERACTIVE] == len(sequence)
    assert 0 < redis.ttl(backlog) <= settings.queue_ttl_s
    full = Submission("echo", b'{"inputs": [1, 1]}', "application/json", tenant="a", fair=True, max_queue_length=200)
    with pytest.raises(QueueFull):  # the backlog's jobs are queued too
        enqueue_job(QueueCache(redis), settings, full)

    qk = layout.queue_keys("inferq.echo")
    served: list[str] = []
    late = ""
    while len(served) < len(sequence) + (1 if late else 0):
        claimed = claims.claim(redis, [qk.name], None)
        assert claimed is not None
        served += [claimed[0], *claims.pop(redis, qk, 3)]
        assert redis.llen(QUEUE) <= 20
        if len(served) >= 100 and not late:
            late = submit(redis, settings, "d")  # a tenant new to the queue: served next, whatever waits
            at = len(served)
    assert sorted(served) == sorted([*owner, late])
    assert late in served[at : at + 4]
    ran = [tag[i] for i in served if i != late]
    assert ran == sorted(ran), "served out of fair order"
    assert redis.exists(QUEUE, backlog, keys.fair_tags_key("inferq.echo")) == 0
