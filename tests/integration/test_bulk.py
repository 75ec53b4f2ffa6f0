"""Bulk batches and priority lanes, in-process against a real redis-server."""

from __future__ import annotations

import json
import threading
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
import redis as redis_py

from inferq.shared import keys
from inferq.shared.jobs import QueueCache, Submission, enqueue_job, get_job_view, new_job_id
from inferq.shared.lifecycle import bulk, layout
from inferq.shared.lifecycle.bulk import BulkItem, NewBatch
from inferq.shared.rqjson import JSONJob, JSONQueue
from inferq.shared.settings import Settings, get_settings
from inferq.workers import batching
from inferq.workers.batching import BatchWorker
from inferq.workers.running import ModelRunner, run_batch
from inferq.workers.webhooks import webhook_worker
from tests.support.echo import POISON, echo_runner


@pytest.fixture
def settings(redis_url: str) -> Settings:
    return Settings(redis_url=redis_url)


def _items(count: int, poison: set[int] = frozenset()) -> list[BulkItem]:  # type: ignore[assignment]
    return [
        BulkItem(f"item-{i}", json.dumps({"inputs": [POISON if i in poison else i, i]}).encode(), "application/json")
        for i in range(count)
    ]


def _batch(redis: redis_py.Redis, settings: Settings, items: list[BulkItem], **options: Any) -> str:
    new = NewBatch(new_job_id(), "echo", keys.BULK, chunk_size=4, result_ttl_s=600, items=items, **options)
    assert bulk.enqueue_batch(redis, settings, new) == ("ok", "")
    return new.id


def _lines(redis: redis_py.Redis, batch_id: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in bulk.result_lines(redis, batch_id, 0, 10_000)]


def _worker(redis: redis_py.Redis, settings: Settings, name: str) -> BatchWorker:
    return BatchWorker({"echo": echo_runner(4)}, connection=redis, settings=settings, name=name)


def test_a_batch_ends_every_item_exactly_once_with_bad_items_failing_alone(
    redis: redis_py.Redis, settings: Settings
) -> None:
    refused = json.dumps({"custom_id": "bad-line", "status": "failed", "error": "line 12: no inputs"})
    batch_id = _batch(redis, settings, _items(10, poison={3}), refused=[refused])
    assert bulk.read_batch(redis, batch_id)["counts"] == {
        "total": 11,
        "queued": 10,
        "running": 0,
        "finished": 0,
        "failed": 1,
        "canceled": 0,
    }
    assert redis.llen("rq:queue:inferq.echo.bulk") == 3  # chunks of 4, 4 and 2: rq info counts chunks
    worker = _worker(redis, settings, "bulk")
    worker.work(burst=True)
    assert worker.batches_run == 3
    view = bulk.read_batch(redis, batch_id)
    assert view["status"] == "finished" and view["ended_at"] is not None
    assert view["counts"] == {"total": 11, "queued": 0, "running": 0, "finished": 9, "failed": 2, "canceled": 0}
    lines = _lines(redis, batch_id)
    assert Counter(line["custom_id"] for line in lines) == Counter(
        {f"item-{i}": 1 for i in range(10)} | {"bad-line": 1}
    )
    by_id = {line["custom_id"]: line for line in lines}
    assert by_id["item-5"] == {
        "custom_id": "item-5",
        "version": 1,
        "weights_sha256": None,  # the echo handler has no weights file
        "status": "finished",
        "result": {"output": [5.0, 5.0]},
    }
    assert by_id["item-3"]["status"] == "failed" and "poison" in by_id["item-3"]["error"]
    # Everything of the batch expires with its result TTL once it ended.
    for key in (keys.batch_key(batch_id), keys.batch_results_key(batch_id)):
        assert 0 < redis.ttl(key) <= 600
    assert redis.zcard("rq:finished:inferq.echo.bulk") == 3


def test_results_stream_while_the_batch_runs(redis: redis_py.Redis, settings: Settings) -> None:
    batch_id = _batch(redis, settings, _items(8))
    worker = _worker(redis, settings, "partial")
    queue = next(q for q in worker.queues if q.name == "inferq.echo.bulk")
    redis.lmove(queue.key, queue.intermediate_queue_key)
    first = keys.chunk_id(batch_id, 0)
    items = worker._start(queue, worker._collect(queue, first, 4))
    assert len(items) == 4 and bulk.read_batch(redis, batch_id)["counts"]["running"] == 4
    assert bulk.read_batch(redis, batch_id)["status"] == "running"
    worker._run(worker.runners["echo"], items, queue)
    worker._finisher.wait()  # the results are stored on the finisher's thread
    assert [line["custom_id"] for line in _lines(redis, batch_id)] == [f"item-{i}" for i in range(4)]
    assert bulk.read_batch(redis, batch_id)["counts"]["finished"] == 4
    # Lines written before the end expire with the record, should the batch never end.
    assert 0 < redis.ttl(keys.batch_results_key(batch_id)) <= redis.ttl(keys.batch_key(batch_id))


def test_cancel_keeps_finished_lines_and_cancels_what_has_not_run(redis: redis_py.Redis, settings: Settings) -> None:
    batch_id = _batch(redis, settings, _items(12))
    worker = _worker(redis, settings, "cancel-bulk")
    queue = next(q for q in worker.queues if q.name == "inferq.echo.bulk")
    redis.lmove(queue.key, queue.intermediate_queue_key)
    items = worker._start(queue, worker._collect(queue, keys.chunk_id(batch_id, 0), 4))
    assert bulk.cancel_batch(redis, settings, batch_id) == "ok"  # chunk 0 runs; chunks 1 and 2 wait
    worker._run(worker.runners["echo"], items, queue)
    worker._finisher.wait()  # the results are stored on the finisher's thread
    _worker(redis, settings, "after-cancel").work(burst=True)
    view = bulk.read_batch(redis, batch_id)
    assert view["status"] == "canceled"
    assert view["counts"] == {"total": 12, "queued": 0, "running": 0, "finished": 4, "failed": 0, "canceled": 8}
    statuses = {line["custom_id"]: line["status"] for line in _lines(redis, batch_id)}
    assert len(_lines(redis, batch_id)) == 12
    assert statuses == {f"item-{i}": "finished" if i < 4 else "canceled" for i in range(12)}
    assert redis.llen("rq:queue:inferq.echo.bulk") == 0
    assert bulk.cancel_batch(redis, settings, batch_id) == "ended"


def test_a_cancel_while_every_remaining_chunk_runs_cancels_nothing_and_the_batch_ends_finished(
    redis: redis_py.Redis, settings: Settings
) -> None:
    batch_id = _batch(redis, settings, _items(4))  # one chunk
    worker = _worker(redis, settings, "late-cancel")
    queue = next(q for q in worker.queues if q.name == "inferq.echo.bulk")
    redis.lmove(queue.key, queue.intermediate_queue_key)
    items = worker._start(queue, worker._collect(queue, keys.chunk_id(batch_id, 0), 4))
    assert bulk.cancel_batch(redis, settings, batch_id) == "ok"  # nothing left to cancel: the chunk runs
    worker._run(worker.runners["echo"], items, queue)
    worker._finisher.wait()
    view = bulk.read_batch(redis, batch_id)
    assert view is not None and view["status"] == "finished"  # its status follows its counts
    assert view["counts"] == {"total": 4, "queued": 0, "running": 0, "finished": 4, "failed": 0, "canceled": 0}


def test_a_chunk_that_ends_after_its_batch_record_expired_recreates_nothing(
    redis: redis_py.Redis, settings: Settings
) -> None:
    batch_id = _batch(redis, settings, _items(2))
    redis.delete(keys.batch_key(batch_id))  # its record expired first (no worker for longer than its TTL)
    _worker(redis, settings, "late").work(burst=True)  # the chunk starts and finishes
    assert redis.exists(keys.batch_key(batch_id)) == 0
    assert [k for k in redis.scan_iter("inferq:*") if redis.ttl(k) == -1] == []


def test_a_chunk_whose_worker_died_runs_again_and_adds_its_lines_once(
    redis: redis_py.Redis, settings: Settings
) -> None:
    batch_id = _batch(redis, settings, _items(4))
    dead = _worker(redis, settings, "dead-bulk")
    queue = next(q for q in dead.queues if q.name == "inferq.echo.bulk")
    redis.lmove(queue.key, queue.intermediate_queue_key)
    items = dead._start(queue, dead._collect(queue, keys.chunk_id(batch_id, 0), 4))
    redis.zadd("rq:wip:inferq.echo.bulk", {f"{items[0].job.id}:{items[0].job.execution_id}": 1})  # heartbeat lapsed
    _worker(redis, settings, "cleaner").clean_registries()  # RQ's maintenance requeues the chunk
    assert bulk.read_batch(redis, batch_id)["counts"]["running"] == 4  # counted once
    _worker(redis, settings, "survivor").work(burst=True)
    lines = _lines(redis, batch_id)
    assert sorted(line["custom_id"] for line in lines) == [f"item-{i}" for i in range(4)]
    assert bulk.read_batch(redis, batch_id)["counts"] == {
        "total": 4,
        "queued": 0,
        "running": 0,
        "finished": 4,
        "failed": 0,
        "canceled": 0,
    }


def test_a_chunk_whose_worker_died_with_no_retries_left_fails_each_item_once(
    redis_url: str, redis: redis_py.Redis
) -> None:
    settings = Settings(redis_url=redis_url, job_retries=0)
    batch_id = _batch(redis, settings, _items(3))
    dead = _worker(redis, settings, "dead-final")
    queue = next(q for q in dead.queues if q.name == "inferq.echo.bulk")
    redis.lmove(queue.key, queue.intermediate_queue_key)
    items = dead._start(queue, dead._collect(queue, keys.chunk_id(batch_id, 0), 4))
    redis.zadd("rq:wip:inferq.echo.bulk", {f"{items[0].job.id}:{items[0].job.execution_id}": 1})
    cleaner = _worker(redis, settings, "cleaner-final")
    cleaner.clean_registries()
    cleaner.clean_registries()
    lines = _lines(redis, batch_id)
    assert [line["status"] for line in lines] == ["failed"] * 3
    assert "died" in lines[0]["error"]
    view = bulk.read_batch(redis, batch_id)
    assert view["status"] == "finished" and view["counts"]["failed"] == 3 and view["counts"]["running"] == 0


def test_a_chunk_expired_in_its_queue_ends_its_items_as_expired(redis: redis_py.Redis, settings: Settings) -> None:
    batch_id = _batch(redis, settings, _items(4))
    chunk = keys.chunk_id(batch_id, 0)
    redis.delete(JSONJob.key_for(chunk))  # its queue TTL (the batch window) ended
    redis.hset(keys.info_key(chunk), "deadline", "1")
    _worker(redis, settings, "expiry-bulk").work(burst=True)
    assert {line["status"] for line in _lines(redis, batch_id)} == {"expired"}
    assert bulk.read_batch(redis, batch_id)["counts"]["failed"] == 4


def _submit(redis: redis_py.Redis, settings: Settings, lane: str, value: float) -> str:
    payload = json.dumps({"inputs": [value, value]}).encode()
    return enqueue_job(QueueCache(redis), settings, Submission("echo", payload, "application/json", lane=lane)).id


def _lanes_in_order(redis: redis_py.Redis, settings: Settings, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Run the worker; the lane of each batch it ran, in order."""
    ran: list[str] = []

    def recording(runner: ModelRunner, items: list[Any]) -> Any:
        ran.append("bulk" if items[0].job.info.get("bulk") else "interactive")
        return run_batch(runner, items)

    monkeypatch.setattr(batching, "run_batch", recording)
    _worker(redis, settings, "lanes").work(burst=True)
    return ran


def test_interactive_work_goes_first_and_bulk_fills_in(
    redis: redis_py.Redis, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    bulk_ids = [_submit(redis, settings, keys.BULK, i) for i in range(8)]
    interactive = [_submit(redis, settings, keys.INTERACTIVE, i) for i in range(8)]
    for job_id in bulk_ids:
        redis.hset(keys.info_key(job_id), "bulk", "1")  # marks the lane for the recording runner
    assert _lanes_in_order(redis, settings, monkeypatch) == ["interactive"] * 2 + ["bulk"] * 2
    assert {get_job_view(redis, i)["status"] for i in bulk_ids + interactive} == {"finished"}


def test_bulk_is_never_starved_by_steady_interactive_work(
    redis_url: str, redis: redis_py.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = Settings(redis_url=redis_url, bulk_share=0.25)
    bulk_ids = [_submit(redis, settings, keys.BULK, i) for i in range(8)]
    for job_id in bulk_ids:
        redis.hset(keys.info_key(job_id), "bulk", "1")
    for i in range(40):
        _submit(redis, settings, keys.INTERACTIVE, i)
    order = _lanes_in_order(redis, settings, monkeypatch)
    # One batch in four serves bulk first while both lanes have work.
    assert order[:8] == ["interactive"] * 3 + ["bulk"] + ["interactive"] * 3 + ["bulk"]
    assert order.count("bulk") == 2 and len(order) == 12


def test_an_interactive_request_arriving_just_after_the_last_one_runs_before_the_next_bulk_chunk(
    redis_url: str, redis: redis_py.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A client that sends its next request once its answer came (an application, a `Prefer: wait` loop) gets
    it run before the bulk lane takes the model, not behind a whole bulk chunk."""
    settings = Settings(redis_url=redis_url, bulk_anticipate_ms=500)
    bulk_ids = [_submit(redis, settings, keys.BULK, i) for i in range(8)]
    for job_id in bulk_ids:
        redis.hset(keys.info_key(job_id), "bulk", "1")
    first = _submit(redis, settings, keys.INTERACTIVE, 0)
    ran: list[str] = []
    later: list[str] = []

    def recording(runner: ModelRunner, items: list[Any]) -> Any:
        lane = "bulk" if items[0].job.info.get("bulk") else "interactive"
        ran.append(lane)
        if len(ran) == 1:  # the next request, sent 50 ms after this batch: well inside the 500 ms window
            threading.Timer(0.05, lambda: later.append(_submit(redis, settings, keys.INTERACTIVE, 1))).start()
        return run_batch(runner, items)

    monkeypatch.setattr(batching, "run_batch", recording)
    _worker(redis, settings, "anticipating").work(burst=True)
    assert ran == ["interactive", "interactive", "bulk", "bulk"]
    assert {get_job_view(redis, i)["status"] for i in [first, *later, *bulk_ids]} == {"finished"}


def test_a_burst_worker_whose_queues_ran_dry_stops_without_a_blocking_wait(
    redis_url: str, redis: redis_py.Redis
) -> None:
    """The anticipation window is for a bulk chunk that waits. With none, `--burst` ends after its last batch:
    it used to block on the interactive queue for the window (plus Redis's timeout resolution) first."""
    settings = Settings(redis_url=redis_url, bulk_anticipate_ms=500)
    job_ids = [_submit(redis, settings, keys.INTERACTIVE, i) for i in range(6)]  # two batches of 4 and 2
    redis.config_resetstat()
    _worker(redis, settings, "dry").work(burst=True)
    assert "cmdstat_blmove" not in redis.info("commandstats")
    assert {get_job_view(redis, i)["status"] for i in job_ids} == {"finished"}


class _Receiver(BaseHTTPRequestHandler):
    bodies: list[dict[str, Any]] = []

    def do_POST(self) -> None:  # noqa: N802 (http.server's name)
        length = int(self.headers["content-length"])
        type(self).bodies.append(json.loads(self.rfile.read(length)))
        self.send_response(204)
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


def test_a_batch_webhook_is_sent_once_when_the_batch_ends(
    redis: redis_py.Redis, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("INFERQ_REDIS_URL", redis_url)
    monkeypatch.setenv("INFERQ_WEBHOOK_ALLOW", "127.0.0.1")
    get_settings.cache_clear()
    settings = get_settings()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Receiver)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/hook"
        batch_id = _batch(redis, settings, _items(6, poison={2}), webhook=url)
        _worker(redis, settings, "hooked").work(burst=True)
        # The delivery's id says it is a batch's: the sender reads the batch, never trying it as a job first.
        assert redis.lrange(f"rq:queue:{keys.WEBHOOK_QUEUE}", 0, -1) == [f"webhook-batch-{batch_id}".encode()]
        webhook_worker(redis, settings).work(burst=True)
        (body,) = _Receiver.bodies
        # A later attempt is scheduled with the same subject, and is the batch's too.
        JSONQueue(keys.WEBHOOK_QUEUE, connection=redis).enqueue(
            layout.DELIVER_FUNC, kwargs={"job_id": layout.BATCH_SUBJECT + batch_id, "attempt": 2}
        )
        webhook_worker(redis, settings).work(burst=True)
    finally:
        server.shutdown()
        server.server_close()
        get_settings.cache_clear()
    first, second = _Receiver.bodies
    for body in (first, second):
        assert body["id"] == batch_id and body["status"] == "finished"
        assert body["counts"] == {"total": 6, "queued": 0, "running": 0, "finished": 5, "failed": 1, "canceled": 0}
    attempts = [json.loads(a) for a in redis.lrange(keys.webhook_attempts_key(batch_id), 0, -1)]
    assert [(a["attempt"], a["outcome"]) for a in attempts] == [(1, "delivered"), (2, "delivered")]
