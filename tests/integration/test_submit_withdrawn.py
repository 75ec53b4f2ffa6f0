"""A submit answered 503 is not stored (lua/withdraw.lua), on a real Redis through the API's own auto-pipelined
client: a timeout is not a refusal, since Redis runs a command it read after its caller gave up, so the API withdraws
the submit before it answers 503."""

from __future__ import annotations

import asyncio
import json
import threading

import pytest
import redis as redis_py

from inferq.api.autopipeline import AutoPipelinedRedis
from inferq.shared import connections, durability, keys
from inferq.shared.connections import is_unavailable
from inferq.shared.errors import InvalidInput
from inferq.shared.jobs import (
    QueueCache,
    Submission,
    _new_job,
    enqueue_job,
    enqueue_job_async,
    get_job_view,
    new_job_id,
)
from inferq.shared.lifecycle import submit
from inferq.shared.settings import Settings
from tests.support.echo import echo_worker
from tests.support.waiting import wait_until

QUEUE = "rq:queue:inferq.echo"
# Redis runs one script at a time: while this one spins, every other command waits in its socket.
SPIN = """local t = redis.call('TIME') local until_s = tonumber(t[1]) + tonumber(ARGV[1])
repeat t = redis.call('TIME') until tonumber(t[1]) >= until_s"""


def _submission(tenant: str = "acme") -> Submission:
    payload = json.dumps({"inputs": [1, 1]}).encode()
    return Submission("echo", payload, "application/json", idempotency_key="k-1", owner="o", tenant=tenant, fair=True)


@pytest.fixture
def settings(redis_url: str) -> Settings:
    return Settings(redis_url=redis_url)


def _stall(redis_url: str) -> threading.Thread:
    """Redis held by another client's script for two seconds, as one slow script holds it for everyone."""
    other = redis_py.Redis.from_url(redis_url)
    for script in submit.scripts.ALL:  # as a running server holds them: the API sends EVALSHA
        other.script_load(script.body)
    spinning = threading.Thread(target=lambda: other.eval(SPIN, 0, 2), daemon=True)
    spinning.start()
    wait_until(lambda: _held(redis_url), 10, "the script to hold Redis")
    return spinning


def _held(url: str) -> bool:
    """Whether Redis is held: a PING gets no answer in 0.2 s (it is answered once the script ends)."""
    probe = redis_py.Redis.from_url(url, socket_timeout=0.2)
    try:
        probe.ping()
        return False
    except redis_py.exceptions.TimeoutError:
        return True
    finally:
        probe.close()


def _nothing_stored(redis: redis_py.Redis, job_id: str) -> list[str]:
    """What is left of a job: none of its keys, no place in its queue, no Idempotency-Key naming it."""
    left = [k.decode() for k in redis.keys(f"*{job_id}*") if not k.decode().startswith("inferq:withdrawn:")]
    left += [f"queued {QUEUE}"] * redis.lrem(QUEUE, 0, job_id)
    idem = redis.get(keys.idempotency_key("o", "k-1"))
    if idem is not None and idem.decode().startswith(job_id):
        left.append("Idempotency-Key")
    return left


def test_a_submit_redis_runs_after_its_caller_gave_up_is_not_stored(
    redis: redis_py.Redis, redis_url: str, settings: Settings
) -> None:
    """Issue 45 item 18: a submit held behind a slow script was answered 503 and stored once the script ended."""
    job_id = new_job_id()
    stalled: list[threading.Thread] = []

    async def attempt() -> BaseException | None:
        pool = connections.async_pool(redis_url, 5.0, max_connections=4)
        client = AutoPipelinedRedis(connection_pool=pool, deadline_s=0.3, settings=settings)
        try:
            await client.ping()  # the API's connections are open already: the submit goes out at once
            stalled.append(await asyncio.to_thread(_stall, redis_url))
            await enqueue_job_async(client, settings, _submission(), job_id)
        except BaseException as exc:  # what the API answers 503 for
            # A withdrawal that got no answer either (a connection of its own still opening) goes again, until Redis
            # runs it: the API's event loop carries on; this one waits for it.
            await asyncio.gather(*getattr(submit, "withdrawing", ()))
            return exc
        finally:
            await client.aclose()
            await pool.disconnect()
        return None

    error = asyncio.run(attempt())
    assert error is not None and is_unavailable(error), error
    stalled[0].join(30)  # the script ended: Redis ran what waited behind it
    assert redis.ping()
    assert _nothing_stored(redis, job_id) == []
    assert redis.llen(QUEUE) == 0 and redis.zcard(keys.fair_tags_key("inferq.echo")) == 0
    # The same submit again (a client's retry with its Idempotency-Key) is a new job, accepted.
    again = enqueue_job(QueueCache(redis), settings, _submission())
    assert again.id != job_id and redis.lrange(QUEUE, 0, -1) == [again.id.encode()]


def test_a_withdrawal_undoes_a_stored_submit_unless_a_worker_took_it(redis: redis_py.Redis, settings: Settings) -> None:
    """The enqueue ran, its answer lost: withdrawn, nothing of it stays and a late copy of it stores nothing; once a
    worker took the job it stands, and the submit is answered as accepted."""
    first = enqueue_job(QueueCache(redis), settings, _submission())
    late = _new_job(settings, _submission(), first.id)
    assert submit.scripts.WITHDRAW(redis, *submit._withdraw_call(late)) == b"withdrawn"
    assert _nothing_stored(redis, first.id) == []
    assert submit.enqueue(redis, late)[0] == "withdrawn"  # the same enqueue, reaching Redis late: refused
    assert _nothing_stored(redis, first.id) == []
    second = enqueue_job(QueueCache(redis), settings, _submission())
    echo_worker(redis, settings).work(burst=True)
    withdrawal = submit._withdraw_call(_new_job(settings, _submission(), second.id))
    assert submit.scripts.WITHDRAW(redis, *withdrawal) == b"taken"
    assert get_job_view(redis, second.id)["status"] == "finished"


def test_a_job_a_retry_was_told_stands_when_its_first_submit_is_withdrawn(
    redis: redis_py.Redis, settings: Settings
) -> None:
    """CI's failover run lost an acknowledged job: its submit ran on the primary (and reached the replica), its answer
    was lost with the primary, and it was answered 503 with its withdrawal left to run in the background; the client's
    retry with its Idempotency-Key reached the promoted replica and was told the job's ID (200); then the withdrawal
    ran there and deleted the job. A job told to a caller stands, as one a worker took."""
    first = enqueue_job(QueueCache(redis), settings, _submission())
    retry = enqueue_job(QueueCache(redis), settings, _submission())
    assert retry.id == first.id
    withdrawal = submit._withdraw_call(_new_job(settings, _submission(), first.id))
    assert submit.scripts.WITHDRAW(redis, *withdrawal) == b"taken"
    assert get_job_view(redis, first.id)["status"] == "queued"
    assert enqueue_job(QueueCache(redis), settings, _submission()).id == first.id  # the key still names it
    echo_worker(redis, settings).work(burst=True)
    assert get_job_view(redis, first.id)["status"] == "finished"


def test_a_different_body_under_a_key_does_not_keep_its_job(redis: redis_py.Redis, settings: Settings) -> None:
    """Only the same request is told the job: another body under the key is refused and holds nothing."""
    first = enqueue_job(QueueCache(redis), settings, _submission())
    other = Submission(
        "echo", b'{"inputs": [2, 2]}', "application/json", idempotency_key="k-1", owner="o", tenant="acme", fair=True
    )
    with pytest.raises(InvalidInput):
        enqueue_job(QueueCache(redis), settings, other)
    withdrawal = submit._withdraw_call(_new_job(settings, _submission(), first.id))
    assert submit.scripts.WITHDRAW(redis, *withdrawal) == b"withdrawn"
    assert _nothing_stored(redis, first.id) == []


def test_a_submit_no_replica_confirmed_is_not_stored(redis: redis_py.Redis, redis_url: str) -> None:
    """INFERQ_DURABILITY=replica with no replica: the submit ran on the primary and was answered 503; its job ran
    and its webhook was sent. Withdrawn, it never runs."""
    settings = Settings(redis_url=redis_url, durability="replica", durability_timeout_ms=100)
    job_id = new_job_id()

    async def attempt() -> BaseException | None:
        pool = connections.async_pool(redis_url, 5.0, max_connections=4)
        client = AutoPipelinedRedis(connection_pool=pool, deadline_s=5.0, settings=settings)
        try:
            await enqueue_job_async(client, settings, _submission(), job_id)
        except BaseException as exc:
            return exc
        finally:
            await client.aclose()
            await pool.disconnect()
        return None

    error = asyncio.run(attempt())
    assert isinstance(error, durability.NotConfirmed) and is_unavailable(error)
    assert _nothing_stored(redis, job_id) == []
    assert redis.llen(QUEUE) == 0
