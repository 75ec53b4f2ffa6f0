"""The API's async Redis client, counted: concurrent commands share pipelines, scripts go by hash, and the async
submit and read write and show exactly what the sync ones do (real redis-server, no processes)."""

from __future__ import annotations

import asyncio
import json
from dataclasses import replace
from typing import Any

import pytest
import redis as redis_py
from redis.asyncio import Redis as AsyncRedis

from inferq.api.autopipeline import AutoPipelinedRedis
from inferq.shared import keys
from inferq.shared.errors import Conflict, NotFound
from inferq.shared.jobs import (
    QueueCache,
    Submission,
    cancel_job,
    cancel_job_async,
    enqueue_job,
    enqueue_job_async,
    get_job_view,
    get_job_view_async,
)
from inferq.shared.lifecycle import layout, scripts
from inferq.shared.settings import Settings
from tests.support.models import ROOT

DIGIT = (ROOT / "samples" / "digit.png").read_bytes()


def test_concurrent_commands_share_pipelines_and_each_gets_its_own_reply(redis_url: str) -> None:
    async def run() -> tuple[list[Any], int, int]:
        client = AutoPipelinedRedis.from_url(redis_url)
        try:
            await client.set("inferq:test:n", 0, ex=60)
            calls = [client.incr("inferq:test:n") for _ in range(100)]
            calls.append(client.hset("inferq:test:n", "f", "v"))  # WRONGTYPE: this call's error alone
            calls.append(client.get("inferq:test:n"))
            replies = await asyncio.gather(*calls, return_exceptions=True)
            return replies, client.batches, client.commands
        finally:
            await client.aclose()

    replies, batches, commands = asyncio.run(run())
    assert replies[:100] == list(range(1, 101))
    assert isinstance(replies[100], redis_py.ResponseError) and "WRONGTYPE" in str(replies[100])
    assert replies[101] == b"100"
    assert commands == 103
    # The SET went alone (nothing else waited); the 102 sent together while it was out share one pipeline.
    assert batches == 2


def test_the_async_scripts_go_by_hash_and_load_themselves_once_when_the_server_lost_them(
    redis: redis_py.Redis, redis_url: str
) -> None:
    redis.script_flush()
    redis.config_resetstat()
    queue = [["inferq:test:q", "inferq:test:q:i", "inferq:test:q:tags", "inferq:test:q:backlog"]]

    async def run() -> list[Any]:
        client = AsyncRedis.from_url(redis_url)
        try:
            return [await scripts.CLAIM_FIRST.call_async(client, [], queue, {"window": 10}) for _ in range(3)]
        finally:
            await client.aclose()

    assert asyncio.run(run()) == [None, None, None]
    stats = redis.info("commandstats")
    # The first EVALSHA found nothing, one EVAL loaded the script, the next two went by hash.
    assert stats["cmdstat_evalsha"]["calls"] == 3
    assert stats["cmdstat_eval"]["calls"] == 1


def _without_times(fields: dict[bytes, bytes]) -> dict[bytes, bytes]:
    return {k: v for k, v in fields.items() if k not in (b"created_at", b"enqueued_at")}


@pytest.mark.parametrize("idempotency_key", [None, "k1"])
def test_the_async_submit_writes_and_shows_what_the_sync_one_does(
    redis: redis_py.Redis, redis_url: str, idempotency_key: str | None
) -> None:
    settings = Settings(redis_url=redis_url)
    submission = Submission("digits", DIGIT, "image/png", webhook="https://example.com/h", owner="o1", retries=1)
    sync_job = enqueue_job(QueueCache(redis), settings, replace(submission, idempotency_key=idempotency_key))

    async def run() -> tuple[Any, Any, Any, dict[str, Any]]:
        client = AutoPipelinedRedis.from_url(redis_url)
        try:
            other = replace(submission, idempotency_key=idempotency_key and "k2")
            job = await enqueue_job_async(client, settings, other)
            again = await enqueue_job_async(client, settings, other)  # the duplicate path, when keyed
            return (
                job,
                again,
                await get_job_view_async(client, job.id, "o1"),
                await get_job_view_async(client, sync_job.id, "o1"),
            )
        finally:
            await client.aclose()

    async_job, again, async_view, sync_view_async = asyncio.run(run())
    assert (again.id == async_job.id) == (idempotency_key is not None)
    sync_hash, async_hash = redis.hgetall(layout.job_key(sync_job.id)), redis.hgetall(layout.job_key(async_job.id))
    assert _without_times(sync_hash) == _without_times(async_hash)
    assert sync_hash.keys() == async_hash.keys()
    assert redis.ttl(layout.job_key(async_job.id)) > 0 and redis.ttl(keys.info_key(async_job.id)) > 0
    assert redis.ttl(keys.payload_key(async_job.id)) > 0
    sync_view = get_job_view(redis, sync_job.id, "o1")
    # expires_at is now + the key's TTL: read a moment apart, it moves by that moment.
    assert {**sync_view_async, "expires_at": None} == {**sync_view, "expires_at": None}
    assert async_view.keys() == sync_view_async.keys()
    assert async_view["status"] == "queued" and async_view["webhook"] == sync_view_async["webhook"]


def test_the_api_connections_pack_commands_byte_for_byte_as_redis_py_does(redis_url: str) -> None:
    """hiredis packs the API's commands: the bytes on the wire are what redis-py's Python packer writes."""
    client = AutoPipelinedRedis.from_url(redis_url)
    fast = client.connection_pool.connection_class()
    plain = AsyncRedis.from_url(redis_url).connection_pool.connection_class()
    command = ("EVALSHA", scripts.ENQUEUE.sha, 2, "k1", "k2", b"\x00\xff bytes", 42, "text é", "")
    assert type(fast) is not type(plain)
    assert b"".join(fast.pack_command(*command)) == b"".join(plain.pack_command(*command))


def test_the_async_cancel_does_what_the_sync_one_does(redis: redis_py.Redis, redis_url: str) -> None:
    settings = Settings(redis_url=redis_url)
    submission = Submission("digits", DIGIT, "image/png", webhook="https://example.com/h", owner="o1")
    sync_job = enqueue_job(QueueCache(redis), settings, submission)
    async_job = enqueue_job(QueueCache(redis), settings, submission)
    cancel_job(QueueCache(redis), settings, sync_job.id, "o1")
    pubsub = redis.pubsub()
    pubsub.subscribe(keys.EVENTS_CHANNEL)
    pubsub.get_message(timeout=1)

    async def run() -> list[str]:
        client = AutoPipelinedRedis.from_url(redis_url)
        refusals = []
        try:
            for job_id, owner in ((async_job.id, "someone else"), ("j-unknown", "o1")):
                with pytest.raises(NotFound):
                    await cancel_job_async(client, settings, job_id, owner)
            await cancel_job_async(client, settings, async_job.id, "o1")
            with pytest.raises(Conflict) as again:
                await cancel_job_async(client, settings, async_job.id, "o1")
            refusals.append(str(again.value))
        finally:
            await client.aclose()
        return refusals

    assert asyncio.run(run()) == [f"job {async_job.id} is already canceled"]
    sync_view, async_view = get_job_view(redis, sync_job.id, "o1"), get_job_view(redis, async_job.id, "o1")
    assert sync_view["status"] == async_view["status"] == "canceled"
    assert redis.llen(layout.queue_keys(keys.queue_name("digits")).queue) == 0
    told = pubsub.get_message(timeout=2)
    assert told is not None and json.loads(told["data"])["id"] == async_job.id  # its event, once
    assert json.loads(told["data"])["status"] == "canceled"
    assert redis.exists(layout.delivery_key(async_job.id)) == redis.exists(layout.delivery_key(sync_job.id)) == 1
    pubsub.close()
