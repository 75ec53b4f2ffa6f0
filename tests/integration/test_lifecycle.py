"""The job-lifecycle store against a real redis-server: declared keys, and every end told exactly once."""

from __future__ import annotations

import ast
import asyncio
import json
import re
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import redis as redis_py
from redis.asyncio import Redis as AsyncRedis
from rq.serializers import JSONSerializer

from inferq.shared import keys, versions
from inferq.shared.errors import QueueFull, Unavailable
from inferq.shared.jobs import (
    QueueCache,
    Submission,
    _new_job,
    cancel_job,
    enqueue_job,
    enqueue_job_async,
    get_job_view,
    new_job_id,
)
from inferq.shared.lifecycle import bulk, calls, claims, layout, scripts, submit
from inferq.shared.lifecycle.bulk import BulkItem, NewBatch
from inferq.shared.lifecycle.upload import BatchWriter
from inferq.shared.models import ModelConfig
from inferq.shared.rqjson import JSONJob
from inferq.shared.settings import Settings
from inferq.workers import batching
from inferq.workers.batching import BatchWorker
from inferq.workers.running import ModelRunner, run_batch
from tests.support.echo import echo_runner
from tests.support.models import ROOT

HOOK = "https://example.com/hook"
# Commands run inside scripts, and which of their arguments are keys (1-based), when not just the first.
KEY_ARGS = {"lmove": (1, 2), "publish": ()}
RQ_KEY = re.compile(r"^rq:[a-z]")


@pytest.fixture
def settings(redis_url: str) -> Settings:
    return Settings(redis_url=redis_url)


def _submit(redis: redis_py.Redis, settings: Settings, webhook: str | None = HOOK, **options: Any) -> str:
    payload = json.dumps({"inputs": [1.0, 2.0]}).encode()
    submission = Submission("echo", payload, "application/json", webhook=webhook, **options)
    return enqueue_job(QueueCache(redis), settings, submission).id


def _submit_async(redis_url: str, settings: Settings) -> list[str]:
    """Two submits as the API makes them (redis.asyncio, EVALSHA) after the server forgot its scripts."""
    redis_py.Redis.from_url(redis_url).script_flush()

    async def submit() -> list[str]:
        client = AsyncRedis.from_url(redis_url)
        try:
            submission = Submission("echo", json.dumps({"inputs": [1.0, 2.0]}).encode(), "application/json")
            return [(await enqueue_job_async(client, settings, submission)).id for _ in range(2)]
        finally:
            await client.aclose()

    return asyncio.run(submit())


class Events:
    """Every event published while it listens."""

    def __init__(self, redis: redis_py.Redis) -> None:
        self.pubsub = redis.pubsub()
        self.pubsub.subscribe(keys.EVENTS_CHANNEL)
        assert self.pubsub.get_message(timeout=1)["type"] == "subscribe"

    def of(self, job_id: str) -> list[str]:
        told = []
        while (message := self.pubsub.get_message(timeout=0.3)) is not None:
            told.append(json.loads(message["data"]))
        self.pubsub.close()
        return [event["status"] for event in told if event["id"] == job_id]


def _deliveries(redis: redis_py.Redis) -> list[str]:
    return [i.decode() for i in redis.lrange(f"rq:queue:{keys.WEBHOOK_QUEUE}", 0, -1)]


@dataclass(frozen=True)
class Monitored:
    """One command the server ran: by a script (``lua``) or a client, its arguments still escaped."""

    lua: bool
    args: list[str]


_MONITOR_LINE = re.compile(r"^[\d.]+ \[\d+ (\S+)\] (.*)$", re.S)
_ARG = re.compile(r'"((?:[^"\\]|\\.)*)"')


@pytest.fixture
def monitored(redis_url: str) -> Iterator[list[Monitored]]:
    """Every command the server runs while the test runs, scripts' own commands included (MONITOR)."""
    commands: list[Monitored] = []
    client = redis_py.Redis.from_url(redis_url)
    connection = client.connection_pool.get_connection()
    connection.send_command("MONITOR")
    assert connection.read_response() in (b"OK", "OK")
    marker = "monitor-end-marker"

    def listen() -> None:
        while True:
            line = connection.read_response()
            match = _MONITOR_LINE.match(line.decode("utf-8", "replace"))
            assert match is not None, line
            args = _ARG.findall(match.group(2))
            if marker in args:
                return
            commands.append(Monitored(match.group(1) == "lua", args))

    thread = threading.Thread(target=listen, daemon=True)
    thread.start()
    yield commands
    client.set(marker, "1", ex=5)
    thread.join(timeout=10)
    connection.disconnect()
    client.close()


def test_every_key_a_script_touches_is_declared_in_its_keys(
    redis: redis_py.Redis,
    redis_url: str,
    settings: Settings,
    monitored: list[dict[str, Any]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Redis's rule for scripts (enforced by a Cluster): keys come in KEYS, never built in the script."""
    monkeypatch.setattr(layout, "FAIR_WINDOW", 2)  # the fair order's backlog too (lib/fair.lua)
    finished = _submit(redis, settings, idempotency_key="k1")
    _submit(redis, settings, idempotency_key="k1")  # the duplicate path
    canceled_queued = _submit(redis, settings)
    cancel_job(QueueCache(redis), settings, canceled_queued)
    # Tenants: a quota counted, and the weighted fair order of several (lib/fair.lua), a pivot among them canceled.
    fair = [_submit(redis, settings, tenant=t, fair=True, jobs_per_minute=100) for t in ("t1", "t1", "t2")]
    cancel_job(QueueCache(redis), settings, fair[1])
    _submit(redis, settings, tenant="t3", fair=True)
    # A submit whose answer was lost, withdrawn (as the API does before its 503).
    lost = Submission("echo", b'{"inputs": [1, 1]}', "application/json", idempotency_key="k9", tenant="t2", fair=True)
    lost_id = enqueue_job(QueueCache(redis), settings, lost).id
    scripts.WITHDRAW(redis, *submit._withdraw_call(_new_job(settings, lost, lost_id)))
    expired = _submit(redis, settings)
    redis.delete(JSONJob.key_for(expired))
    redis.hset(keys.info_key(expired), "deadline", f"{time.time() - 1:.3f}")
    items = [BulkItem(f"c{i}", json.dumps({"inputs": [i, i]}).encode(), "application/json") for i in range(6)]
    batch = NewBatch(new_job_id(), "echo", keys.BULK, 4, 600, items=items, idempotency=("inferq:idem:b", "x y"))
    bulk.enqueue_batch(redis, settings, batch)
    fair_batch = NewBatch(
        new_job_id(), "echo", keys.BULK, 4, 600, items=items, tenant="t1", fair=True, weight=2, bulk_lines=100
    )
    bulk.enqueue_batch(redis, settings, fair_batch)
    BatchWriter(redis, settings, new_job_id(), "echo", keys.BULK, 4, 600).check_ids([("c0", 1), ("c0", 2)])
    worker = BatchWorker({"echo": echo_runner(4)}, connection=redis, settings=settings, name="declared")
    worker.work(burst=True)
    canceled_batch = NewBatch(new_job_id(), "echo", keys.BULK, 4, 600, items=items)
    bulk.enqueue_batch(redis, settings, canceled_batch)
    bulk.cancel_batch(redis, settings, canceled_batch.id)
    held = _submit(redis, settings)
    payload = json.dumps({"inputs": [1.0, 2.0]}).encode()  # _submit's, read ahead as the overlap reads it
    assert claims.read_inputs(redis, [held, "gone"]) == [(payload, "application/json"), (None, "")]
    queue = worker.queues[0]
    redis.lmove(queue.key, queue.intermediate_queue_key)
    claims.give_back_held(redis, layout.queue_keys(queue.name), [held])
    items = worker._start(queue, worker._collect(queue, held, 4))
    claims.give_back(redis, layout.queue_keys(queue.name), [(i.job.id, i.job.execution_id) for i in items], worker.name)
    stranded = _submit(redis, settings)  # popped, then its worker died
    redis.lrem(queue.key, 1, stranded)
    redis.rpush(queue.intermediate_queue_key, stranded)
    redis.set(queue.intermediate_queue.get_first_seen_key(stranded), time.time() - 120)
    assert claims.rescue_stuck(redis, queue) == [stranded]
    claims.announce_failed(redis, settings, [finished])
    claims.claim(redis, [queue.name, "inferq.other"], None)
    version_2 = ModelConfig.model_validate({"name": "m", "version": 2, "input": {"kind": "tensor", "shape": [2]}})
    # A version's window of outcomes, for its rollback.
    versions.judge(redis, version_2, [(True, "a"), (False, "b")], None, True)
    _submit_async(redis_url, settings)  # the API's submit: EVALSHA, and the EVAL that loads it once
    assert get_job_view(redis, finished)["status"] == "finished"
    assert get_job_view(redis, expired)["status"] == "expired"

    scripts_seen: set[str] = set()
    by_sha = {s.sha: s.name for s in scripts.ALL}
    evalshas = evals = 0
    violations = []
    declared: set[str] | None = None
    script = ""
    checked = 0
    for command in list(monitored):
        name = command.args[0].lower()
        if command.lua and declared is not None:
            positions = KEY_ARGS.get(name, (1,))
            touched = [command.args[i] for i in positions if i < len(command.args)]
            undeclared = [key for key in touched if key not in declared]
            checked += 1
            if undeclared:
                violations.append((script, name, undeclared))
        elif name in ("eval", "evalsha"):
            if name == "eval":
                found = re.match(r"-- inferq:([a-z-]+)", command.args[1])
                assert found is not None, f"an EVAL of no named script: {command.args[1][:80]!r}"
                script = found.group(1)
                evals += 1
            else:
                assert command.args[1] in by_sha, f"an EVALSHA of no named script: {command.args[1]!r}"
                script = by_sha[command.args[1]]
                evalshas += 1
            numkeys = int(command.args[2])
            declared = set(command.args[3 : 3 + numkeys])
            scripts_seen.add(script)
        elif not command.lua:
            declared = None
    assert violations == []
    assert checked > 100  # the scripts' own commands were seen
    # A script's body crosses to Redis only when the server lacks it (an EVAL after a NOSCRIPT; SCRIPT LOAD before a
    # pipeline, once per connection): every other call names it by hash.
    assert evals <= len(scripts_seen) < evalshas
    # Every named script ran at least once in this walk through a job's life.
    assert scripts_seen == {s.name for s in scripts.ALL}


def test_a_cancel_between_the_pop_and_the_start_is_told_once_and_the_job_never_starts(
    redis: redis_py.Redis, redis_url: str, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The start used to mark it started and publish `started`, then restore `canceled` and publish it again."""
    job_id = _submit(redis, settings)
    worker = BatchWorker({"echo": echo_runner(4)}, connection=redis, settings=settings, name="cancel-start")
    collect = worker._collect
    other = redis_py.Redis.from_url(redis_url)

    def collect_then_cancel(queue: Any, first_id: str, max_batch: int) -> list[str]:
        job_ids = collect(queue, first_id, max_batch)
        cancel_job(QueueCache(other), settings, job_id)
        return job_ids

    monkeypatch.setattr(worker, "_collect", collect_then_cancel)
    events = Events(redis)
    worker.work(burst=True)
    assert events.of(job_id) == ["canceled"]
    view = get_job_view(redis, job_id)
    assert view["status"] == "canceled" and view["started_at"] is None
    assert _deliveries(redis) == [f"webhook-{job_id}"]
    assert redis.zcard("rq:wip:inferq.echo") == 0 and redis.llen("rq:queue:inferq.echo:intermediate") == 0
    assert redis.keys("rq:execution*") == []
    other.close()


def test_a_finish_after_maintenance_failed_the_job_keeps_it_failed_and_tells_once(
    redis: redis_py.Redis, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker presumed dead (its heartbeat lapsed) that finishes anyway used to write `finished` over `failed`,
    publish a second end and queue a second webhook."""
    job_id = _submit(redis, settings, retries=0)
    worker = BatchWorker({"echo": echo_runner(4)}, connection=redis, settings=settings, name="presumed-dead")
    cleaner = BatchWorker({"echo": echo_runner(4)}, connection=redis, settings=settings, name="cleaner")

    def run_while_presumed_dead(runner: ModelRunner, items: list[Any]) -> Any:
        report = run_batch(runner, items)
        execution = f"{job_id}:{items[0].job.execution_id}"
        redis.zadd("rq:wip:inferq.echo", {execution: 1})  # its heartbeat score lapsed
        cleaner.clean_registries()  # RQ's maintenance fails it (no retries left) and announces it
        return report

    monkeypatch.setattr(batching, "run_batch", run_while_presumed_dead)
    events = Events(redis)
    worker.work(burst=True)
    assert events.of(job_id) == ["started", "failed"]
    view = get_job_view(redis, job_id)
    assert view["status"] == "failed" and view["result"] is None and "died" in view["error"]
    assert _deliveries(redis) == [f"webhook-{job_id}"]
    assert redis.zcard("rq:finished:inferq.echo") == 0
    assert int(redis.hget(worker.key, "successful_job_count") or 0) == 0


def test_a_job_that_expired_in_its_queue_is_told_expired_with_its_webhook(
    redis: redis_py.Redis, settings: Settings
) -> None:
    """Expired jobs used to end silently: no event for waiters, no webhook."""
    job_id = _submit(redis, settings)
    live = _submit(redis, settings, webhook=None)
    redis.delete(JSONJob.key_for(job_id))  # RQ's queue TTL ended its hash...
    redis.hset(keys.info_key(job_id), "deadline", f"{time.time() - 1:.3f}")  # ...at its deadline
    events = Events(redis)
    BatchWorker({"echo": echo_runner(4)}, connection=redis, settings=settings, name="expiry").work(burst=True)
    assert events.of(job_id) == ["expired"]
    assert get_job_view(redis, job_id)["status"] == "expired"
    assert get_job_view(redis, live)["status"] == "finished"
    assert _deliveries(redis) == [f"webhook-{job_id}"]
    delivery = JSONJob.fetch(f"webhook-{job_id}", connection=redis, serializer=JSONSerializer)
    assert delivery.func_name == layout.DELIVER_FUNC and delivery.get_status() == "queued"
    assert delivery.origin == keys.WEBHOOK_QUEUE and delivery.retries_left == layout.WEBHOOK_CRASH_RETRIES
    assert redis.ttl(delivery.key) > 0
    assert get_job_view(redis, job_id)["webhook"]["url"] == HOOK


def test_a_forced_stop_gives_back_only_what_this_worker_still_runs(redis: redis_py.Redis, settings: Settings) -> None:
    ids = [_submit(redis, settings, webhook=None) for _ in range(3)]
    worker = BatchWorker({"echo": echo_runner(4)}, connection=redis, settings=settings, name="give-back")
    queue = worker.queues[0]
    redis.lmove(queue.key, queue.intermediate_queue_key)
    items = worker._start(queue, worker._collect(queue, ids[0], 4))
    cancel_job(QueueCache(redis), settings, ids[1])
    back = claims.give_back(
        redis, layout.queue_keys(queue.name), [(i.job.id, i.job.execution_id) for i in items], worker.name
    )
    assert back == [ids[0], ids[2]]
    assert redis.lrange(queue.key, 0, -1) == [ids[0].encode(), ids[2].encode()]
    assert [get_job_view(redis, i)["status"] for i in ids] == ["queued", "canceled", "queued"]
    assert redis.zcard("rq:wip:inferq.echo") == 0 and redis.keys("rq:execution*") == []


def test_only_the_lifecycle_store_knows_rqs_storage_layout() -> None:
    """No Lua, no RQ key literal, no RQ private field set anywhere else in the product's code."""
    offenders = []
    for package in ("api", "workers", "shared", "inferq"):
        for path in sorted((ROOT / package).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if rel.startswith("shared/lifecycle/"):
                continue
            tree = ast.parse(path.read_text())
            for node in ast.walk(tree):
                if isinstance(node, ast.Constant) and isinstance(node.value, str) and RQ_KEY.match(node.value):
                    offenders.append(f"{rel}:{node.lineno} RQ key literal {node.value!r}")
                # Redis's eval takes arguments; torch's module.eval() has none.
                called = node.func.attr if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) else ""
                if called in {"eval", "evalsha", "register_script"} and node.args:
                    offenders.append(f"{rel}:{node.lineno} runs a script ({node.func.attr})")
                if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store) and node.attr == "_status":
                    offenders.append(f"{rel}:{node.lineno} sets RQ's private _status")
    assert offenders == []


def test_a_job_canceled_while_stranded_in_the_intermediate_list_stays_canceled(
    redis: redis_py.Redis, settings: Settings
) -> None:
    """RQ's intermediate-list cleanup fails what a dead worker popped; a cancel in between must win."""
    job_id = _submit(redis, settings)
    queue = BatchWorker({"echo": echo_runner(4)}, connection=redis, settings=settings, name="popped").queues[0]
    redis.lmove(queue.key, queue.intermediate_queue_key)  # popped, then its worker died
    cancel_job(QueueCache(redis), settings, job_id)
    events = Events(redis)
    cleaner = BatchWorker({"echo": echo_runner(4)}, connection=redis, settings=settings, name="cleaner")
    job = JSONJob.fetch(job_id, connection=redis, serializer=JSONSerializer)
    cleaner.handle_job_failure(job, queue, exc_string="Job was stuck in intermediate queue.")
    assert get_job_view(redis, job_id)["status"] == "canceled"
    assert events.of(job_id) == []
    assert _deliveries(redis) == [f"webhook-{job_id}"]


def test_a_refused_submit_leaves_no_input_and_one_without_its_input_queues_nothing(
    redis: redis_py.Redis, settings: Settings
) -> None:
    """The input goes by a SET before ENQUEUE (lua/enqueue.lua): a refusal deletes it, and the script queues nothing
    whose input is not there."""
    small = settings.model_copy(update={"max_queue_length": 1})
    first = _submit(redis, small, webhook=None)
    payloads = {k for k in redis.scan_iter(keys.payload_key("*"))}
    assert payloads == {keys.payload_key(first).encode()}
    with pytest.raises(QueueFull):
        _submit(redis, small, webhook=None)
    assert {k for k in redis.scan_iter(keys.payload_key("*"))} == payloads  # the refused one's input went with it
    new = _new_job(settings, Submission("echo", b'{"inputs": [1]}', "application/json"))
    fixed, items, args, _ = submit._enqueue_call(new)  # the script alone: its input never SET
    assert [calls.text(v) for v in scripts.ENQUEUE(redis, fixed, items, args)] == ["lost", ""]
    assert not redis.exists(layout.job_key(new.id), keys.info_key(new.id))
    assert redis.lrange(layout.queue_keys(keys.queue_name("echo", new.lane)).queue, 0, -1) == [first.encode()]
    with pytest.raises(Unavailable, match="input"):
        submit.check_enqueued("lost", "", "", "echo")


def test_a_started_job_is_in_rqs_started_registry_with_no_execution_hash_and_a_cancel_takes_it_out(
    redis: redis_py.Redis, settings: Settings
) -> None:
    """RQ's started registry lists a running job (``rq info``, rq-dashboard); RQ's per-job execution hashes are not
    written (lua/start.lua), and a cancel finds the registry entry by the job hash's own field."""
    from rq.registry import StartedJobRegistry
    from rq.serializers import JSONSerializer

    job_id = _submit(redis, settings, webhook=None)
    qk = layout.queue_keys("inferq.echo")
    assert redis.lmove(qk.queue, qk.intermediate) == job_id.encode()  # popped, as a claim pops
    with redis.pipeline() as pipe:
        call = claims.start(pipe, settings, qk, [job_id], "w-registry", 60, 600)
        started = claims.started(call, pipe.execute())
    assert [j.id for j in started.jobs] == [job_id]
    registry = StartedJobRegistry("inferq.echo", connection=redis, serializer=JSONSerializer)
    assert registry.get_job_ids() == [job_id]
    assert redis.keys("rq:execution*") == []
    assert redis.hget(layout.job_key(job_id), "inferq_execution") == started.jobs[0].execution_id.encode()
    cancel_job(QueueCache(redis), settings, job_id)
    assert registry.get_job_ids() == [] and get_job_view(redis, job_id)["status"] == "canceled"
