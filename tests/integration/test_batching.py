"""The batching worker in-process against a real redis-server."""

from __future__ import annotations

import json
import signal
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import redis as redis_py
from rq.exceptions import StopRequested
from rq.utils import utcformat

from inferq.shared import keys
from inferq.shared.errors import NotFound
from inferq.shared.jobs import QueueCache, Submission, cancel_job, enqueue_job, get_job_view
from inferq.shared.lifecycle import claims
from inferq.shared.rqjson import JSONJob
from inferq.shared.settings import Settings
from inferq.workers import batching
from inferq.workers.batching import BatchWorker
from inferq.workers.running import ModelRunner, run_batch
from tests.support.counting import CountingConnection, counting_client
from tests.support.echo import POISON, echo_runner, submit_echo


@pytest.fixture
def settings(redis_url: str) -> Settings:
    return Settings(redis_url=redis_url)


def test_a_burst_runs_everything_waiting_as_batches_of_max_batch(redis: redis_py.Redis, settings: Settings) -> None:
    ids = [submit_echo(redis, settings, [i, -i]) for i in range(10)]
    worker = BatchWorker({"echo": echo_runner(max_batch=4)}, connection=redis, settings=settings, name="t1")
    worker.work(burst=True)
    views = [get_job_view(redis, i) for i in ids]
    assert [v["result"] for v in views] == [{"output": [float(i), float(-i)]} for i in range(10)]
    assert [v["batch_size"] for v in views] == [4] * 8 + [2] * 2
    assert worker.batches_run == 3
    assert redis.llen("rq:queue:inferq.echo:intermediate") == 0
    assert redis.zcard("rq:wip:inferq.echo") == 0
    assert redis.zcard("rq:finished:inferq.echo") == 10
    assert all(redis.exists(keys.payload_key(i)) == 0 for i in ids)


def test_redis_round_trips_per_batch_are_at_most_4_whatever_the_batch_size(redis_url: str, settings: Settings) -> None:
    """Counted over RQ's whole work loop, from one batch's start to the next one's."""
    per_batch = {}
    for max_batch in (1, 16):
        client = counting_client(redis_url)
        client.flushall()
        for i in range(5 * max_batch):
            submit_echo(client, settings, [i, i])
        worker = BatchWorker(
            {"echo": echo_runner(max_batch)}, connection=client, settings=settings, name=f"rt{max_batch}"
        )
        # Heartbeats and suspension checks go by the clock (at most once a second), not by the batch: none
        # is due during the count, or one landing in a window read as a batch's.
        worker._heartbeat_every_s = worker.suspension_check_interval_s = 3600.0
        marks: list[int] = []
        execute = worker.execute_job

        def counted(
            job: JSONJob, queue: object, execute: object = execute, marks: list[int] = marks, worker: Any = worker
        ) -> None:
            # The last batch's finish runs on the finisher's thread, maybe still: counted in its own batch's
            # window, not in whichever window it happened to land (one window then showed 6, the next 4).
            worker._finisher.wait()
            marks.append(CountingConnection.sent)
            execute(job, queue)  # type: ignore[operator]

        worker.execute_job = counted  # type: ignore[method-assign]
        worker.work(burst=True)
        assert worker.batches_run == 5
        steady = [b - a for a, b in zip(marks[1:], marks[2:], strict=False)]
        per_batch[max_batch] = max(steady)
        client.close()
    print("Redis round trips per batch:", per_batch)
    # Claim, pop the rest (not needed for a batch of one), start and load, finish (on the finisher's thread, while
    # the next batch is claimed: workers/threads.Finisher). No idle state between batches: a job was waiting.
    assert per_batch[1] == 3
    assert per_batch[16] == 4


def test_expired_and_canceled_jobs_are_dropped_from_a_batch(redis: redis_py.Redis, settings: Settings) -> None:
    from inferq.shared.jobs import cancel_job

    live = submit_echo(redis, settings, [1, 1])
    expired = submit_echo(redis, settings, [2, 2])
    canceled = submit_echo(redis, settings, [3, 3])
    redis.delete(JSONJob.key_for(expired))  # as if its queue TTL passed
    cancel_job(QueueCache(redis), settings, canceled)
    worker = BatchWorker({"echo": echo_runner()}, connection=redis, settings=settings, name="t3")
    worker.work(burst=True)
    assert get_job_view(redis, live)["batch_size"] == 1
    assert get_job_view(redis, canceled)["status"] == "canceled"
    assert redis.llen("rq:queue:inferq.echo:intermediate") == 0


def test_rq_sees_what_its_own_worker_would_have_written(redis: redis_py.Redis, settings: Settings) -> None:
    from rq.registry import FailedJobRegistry, FinishedJobRegistry, StartedJobRegistry
    from rq.results import Result
    from rq.serializers import JSONSerializer

    good = submit_echo(redis, settings, [1, 2])
    bad = submit_echo(redis, settings, [POISON, 0])
    worker = BatchWorker({"echo": echo_runner()}, connection=redis, settings=settings, name="fidelity")
    worker.work(burst=True)
    args = {"connection": redis, "serializer": JSONSerializer}
    assert FinishedJobRegistry("inferq.echo", **args).get_job_ids() == [good]
    assert FailedJobRegistry("inferq.echo", **args).get_job_ids() == [bad]
    assert StartedJobRegistry("inferq.echo", **args).get_job_ids() == []
    job = JSONJob.fetch(good, connection=redis, serializer=JSONSerializer)
    assert job.get_status() == "finished" and job.worker_name == "fidelity"
    assert job.started_at and job.ended_at and job.ended_at >= job.started_at
    result = job.latest_result()
    assert result is not None and result.type == Result.Type.SUCCESSFUL
    assert result.return_value == {"output": [1.0, 2.0]}
    assert job.return_value() == {"output": [1.0, 2.0]}
    failed = JSONJob.fetch(bad, connection=redis, serializer=JSONSerializer)
    assert failed.get_status() == "failed"
    failure = failed.latest_result()
    assert failure is not None and failure.type == Result.Type.FAILED
    assert "poison value" in (failure.exc_string or "")
    assert redis.keys("rq:execution:*") == [] and redis.keys("rq:executions:*") == []
    assert int(redis.hget(worker.key, "successful_job_count")) == 1
    assert int(redis.hget(worker.key, "failed_job_count")) == 1


def test_max_wait_is_measured_on_the_workers_clock_not_the_apis(
    redis: redis_py.Redis, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An API host whose clock runs 5 s fast must not turn a 50 ms fill wait into 5 s."""
    job_id = submit_echo(redis, settings, [1.0, 2.0])
    ahead = datetime.now(UTC) + timedelta(seconds=5)
    redis.hset(JSONJob.key_for(job_id), "enqueued_at", utcformat(ahead))
    worker = BatchWorker({"echo": echo_runner(4)}, connection=redis, settings=settings, name="skew", max_wait_ms=50)
    loads = 0
    pop = claims.pop

    def counted(*args: object) -> object:
        nonlocal loads
        loads += 1
        return pop(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(claims, "pop", counted)
    worker.work(burst=True)
    assert get_job_view(redis, job_id)["status"] == "finished"
    # Each poll sleeps 2 ms: about 25 polls fill 50 ms; the API's clock would have made it about 2,500.
    assert loads < 200


def _a_job_arrives_during_the_wait(
    redis: redis_py.Redis, settings: Settings, monkeypatch: pytest.MonkeyPatch, batch_wait: str
) -> tuple[str, list[str], int, BatchWorker]:
    """One job waits; a client's job arrives while the worker looks for more (its second pop in a batch). The arrival
    comes from the pop itself, so the test does not depend on the clock. The worker (max batch 2) has the echo
    model's batch-time curve as if timed, 0.5 s of fixed cost per batch, so a wait would pay; it runs a burst.

    Returns the first job, the late one (if it came), the worker's count of pops, and the worker."""
    first = submit_echo(redis, settings, [1.0, 1.0])
    late: list[str] = []
    pops = 0
    pop = claims.pop

    def arriving(*args: object) -> object:
        nonlocal pops
        pops += 1
        if pops == 2:
            late.append(submit_echo(redis, settings, [9.0, 9.0]))
        return pop(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(claims, "pop", arriving)
    worker = BatchWorker(
        {"echo": echo_runner(2)}, connection=redis, settings=settings, name=batch_wait, batch_wait=batch_wait
    )
    for size in (1, 2, 3):
        worker.fill["echo"].ran(size, 0.5 + 0.01 * size)
    worker.work(burst=True)
    return first, late, pops, worker


def test_the_adaptive_wait_takes_a_job_that_arrives_while_it_waits(
    redis: redis_py.Redis, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    first, late, pops, worker = _a_job_arrives_during_the_wait(redis, settings, monkeypatch, "adaptive")
    assert len(late) == 1
    assert [get_job_view(redis, i)["batch_size"] for i in (first, late[0])] == [2, 2]
    assert worker.batches_run == 1
    assert pops == 2  # the batch was full after the arrival: no more looks


def test_a_greedy_worker_runs_what_waits_at_once(
    redis: redis_py.Redis, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    first, late, pops, _ = _a_job_arrives_during_the_wait(redis, settings, monkeypatch, "greedy")
    assert late == [] and pops == 1  # one pop for what waited, then the batch ran
    assert get_job_view(redis, first)["batch_size"] == 1


def test_the_worker_times_its_batches_for_the_adaptive_wait(redis: redis_py.Redis, settings: Settings) -> None:
    for i in range(10):
        submit_echo(redis, settings, [i, i])
    worker = BatchWorker({"echo": echo_runner(4)}, connection=redis, settings=settings, name="curve")
    worker.work(burst=True)
    curve = worker.fill["echo"].curve
    assert curve.counts == {4: 2, 2: 1}
    assert all(seconds > 0 for seconds in curve.seconds.values())


def test_a_job_that_vanishes_before_its_batch_starts_is_skipped_not_recreated(
    redis: redis_py.Redis, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    ids = [submit_echo(redis, settings, [i, i]) for i in range(3)]
    worker = BatchWorker({"echo": echo_runner(4)}, connection=redis, settings=settings, name="vanish-start")
    start = worker._start

    def expire_one_first(queue: Any, job_ids: list[str], *read: Any) -> Any:
        redis.delete(JSONJob.key_for(ids[1]))  # its hash expires between the pop and the start
        return start(queue, job_ids, *read)

    monkeypatch.setattr(worker, "_start", expire_one_first)
    worker.work(burst=True)
    assert redis.exists(JSONJob.key_for(ids[1])) == 0  # no partial hash of status fields
    with pytest.raises(NotFound):
        get_job_view(redis, ids[1])
    assert [get_job_view(redis, ids[i])["status"] for i in (0, 2)] == ["finished", "finished"]
    assert get_job_view(redis, ids[0])["batch_size"] == 2
    assert redis.zcard("rq:wip:inferq.echo") == 0


def test_a_job_that_vanishes_while_its_batch_runs_gets_no_partial_hash(
    redis: redis_py.Redis, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    ids = [submit_echo(redis, settings, [i, i]) for i in range(3)]
    worker = BatchWorker({"echo": echo_runner(4)}, connection=redis, settings=settings, name="vanish-run")

    def run_then_lose_one(runner: ModelRunner, items: list[Any]) -> Any:
        report = run_batch(runner, items)
        redis.delete(JSONJob.key_for(ids[2]))  # Redis lost it mid-batch (a restart without persistence)
        return report

    monkeypatch.setattr(batching, "run_batch", run_then_lose_one)
    worker.work(burst=True)
    assert redis.exists(JSONJob.key_for(ids[2])) == 0
    assert redis.exists(f"rq:results:{ids[2]}") == 0
    with pytest.raises(NotFound):
        get_job_view(redis, ids[2])
    assert [get_job_view(redis, ids[i])["status"] for i in (0, 1)] == ["finished", "finished"]
    assert redis.zcard("rq:wip:inferq.echo") == 0


def test_running_jobs_outlive_the_job_timeout(redis: redis_py.Redis, settings: Settings) -> None:
    job_id = submit_echo(redis, settings, [1, 1])
    worker = BatchWorker({"echo": echo_runner(4)}, connection=redis, settings=settings, name="ttl")
    queue = worker.queues[0]
    redis.lmove(queue.key, queue.intermediate_queue_key)
    worker._start(queue, worker._collect(queue, job_id, 4))
    assert redis.ttl(JSONJob.key_for(job_id)) > settings.job_timeout_s + settings.heartbeat_ttl_s


def test_a_batch_past_the_job_timeout_fails_readably_and_frees_the_worker(
    redis: redis_py.Redis, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A 1 s timeout used to let an 8 s batch finish; a hung forward pass held its jobs started forever."""
    monkeypatch.setenv("INFERQ_TEST_SLOW_S", "8")
    settings = Settings(redis_url=redis_url, job_timeout_s=1)
    ids = [submit_echo(redis, settings, [i, i]) for i in range(2)]
    worker = BatchWorker({"echo": echo_runner(4)}, connection=redis, settings=settings, name="timeout")
    worker.work(burst=True)
    views = [get_job_view(redis, job_id) for job_id in ids]
    assert [view["status"] for view in views] == ["failed", "failed"]
    assert {view["error"] for view in views} == {"the batch ran past the job timeout of 1 s (INFERQ_JOB_TIMEOUT_S)"}
    assert redis.zcard("rq:wip:inferq.echo") == 0
    assert worker.batches_run == 1


def test_a_dead_workers_job_failed_by_maintenance_is_announced_once(redis: redis_py.Redis, settings: Settings) -> None:
    """RQ's cleanup failed such jobs silently: no failed event for waiters, no webhook."""
    payload = json.dumps({"inputs": [1, 1]}).encode()
    submission = Submission("echo", payload, "application/json", webhook="https://example.com/hook", retries=0)
    job_id = enqueue_job(QueueCache(redis), settings, submission).id
    dead = BatchWorker({"echo": echo_runner(4)}, connection=redis, settings=settings, name="dead")
    queue = dead.queues[0]
    redis.lmove(queue.key, queue.intermediate_queue_key)
    items = dead._start(queue, dead._collect(queue, job_id, 4))  # started, then its worker is gone
    redis.zadd("rq:wip:inferq.echo", {f"{job_id}:{items[0].job.execution_id}": 1})  # the heartbeat score lapses
    events = redis.pubsub()
    events.subscribe(keys.EVENTS_CHANNEL)
    assert events.get_message(timeout=1)["type"] == "subscribe"
    cleaner = BatchWorker({"echo": echo_runner(4)}, connection=redis, settings=settings, name="cleaner")
    cleaner.clean_registries()
    cleaner.clean_registries()  # a second pass announces nothing again
    view = get_job_view(redis, job_id)
    assert view["status"] == "failed" and "died" in view["error"]
    told = []
    while (message := events.get_message(timeout=0.5)) is not None:
        told.append(json.loads(message["data"]))
    assert [(e["id"], e["status"]) for e in told] == [(job_id, "failed")]
    deliveries = redis.lrange(f"rq:queue:{keys.WEBHOOK_QUEUE}", 0, -1)
    assert len(deliveries) == 1
    events.close()


def test_a_cancel_during_the_finish_ends_the_job_once_as_canceled(
    redis: redis_py.Redis, redis_url: str, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """It used to answer OK, yet the finish still wrote finished, published it and queued a second webhook.

    The cancel lands after the batch ran, just before the finish: the finish script sees it and keeps it.
    """
    payload = json.dumps({"inputs": [1, 1]}).encode()
    job_id = enqueue_job(
        QueueCache(redis), settings, Submission("echo", payload, "application/json", webhook="https://example.com/h")
    ).id
    other = redis_py.Redis.from_url(redis_url)

    def run_then_cancel(runner: ModelRunner, items: list[Any]) -> Any:
        report = run_batch(runner, items)
        cancel_job(QueueCache(other), settings, job_id)  # the client's cancel, after the model, before the finish
        return report

    monkeypatch.setattr(batching, "run_batch", run_then_cancel)
    events = redis.pubsub()
    events.subscribe(keys.EVENTS_CHANNEL)
    assert events.get_message(timeout=1)["type"] == "subscribe"
    BatchWorker({"echo": echo_runner(4)}, connection=redis, settings=settings, name="race").work(burst=True)
    view = get_job_view(redis, job_id)
    assert view["status"] == "canceled" and view["result"] is None
    told = []
    while (message := events.get_message(timeout=0.5)) is not None:
        told.append(json.loads(message["data"])["status"])
    assert told == ["started", "canceled"]
    assert redis.llen(f"rq:queue:{keys.WEBHOOK_QUEUE}") == 1
    assert redis.exists(f"rq:results:{job_id}") == 0
    events.close()
    other.close()


def _two_model_worker(redis: redis_py.Redis, settings: Settings, name: str) -> BatchWorker:
    runners = {}
    for model in ("a", "b"):
        runner = echo_runner(2)
        runner.config = runner.config.model_copy(update={"name": model})
        runners[model] = runner
    return BatchWorker(runners, connection=redis, settings=settings, name=name)


def _submit_to(redis: redis_py.Redis, settings: Settings, model: str, value: float) -> str:
    payload = json.dumps({"inputs": [value, value]}).encode()
    return enqueue_job(QueueCache(redis), settings, Submission(model, payload, "application/json")).id


def test_a_worker_of_several_models_claims_atomically_into_the_intermediate_list(
    redis: redis_py.Redis, settings: Settings
) -> None:
    """RQ's several-queue BLPOP left a popped job in no list: a worker killed then lost it."""
    job_id = _submit_to(redis, settings, "b", 1.0)
    worker = _two_model_worker(redis, settings, "atomic")
    claimed = worker.dequeue_job_and_maintain_ttl(timeout=1)
    assert claimed is not None and claimed[0].id == job_id and claimed[1].name == "inferq.b"
    assert redis.lrange("rq:queue:inferq.b:intermediate", 0, -1) == [job_id.encode()]
    assert redis.llen("rq:queue:inferq.b") == 0


def test_a_worker_of_several_models_serves_them_in_turn(redis: redis_py.Redis, settings: Settings) -> None:
    """Strict queue order kept model b's older job behind every job of model a."""
    b_job = _submit_to(redis, settings, "b", 9.0)
    a_jobs = [_submit_to(redis, settings, "a", float(i)) for i in range(8)]
    worker = _two_model_worker(redis, settings, "fair")
    served: list[str] = []
    execute = worker.execute_job

    def record(job: JSONJob, queue: Any) -> None:
        served.append(queue.name)
        execute(job, queue)

    worker.execute_job = record  # type: ignore[method-assign]
    worker.work(burst=True)
    assert served.index("inferq.b") <= 1  # its turn comes within the first two batches, not after a's four
    assert get_job_view(redis, b_job)["status"] == "finished"
    assert [get_job_view(redis, j)["status"] for j in a_jobs] == ["finished"] * 8


def test_a_batch_finishing_on_the_finisher_thread_never_shows_the_next_one_idle(
    redis: redis_py.Redis, settings: Settings
) -> None:
    """Batch 1's results are stored while batch 2 runs; batch 2 runs with the worker BUSY, and the burst
    returns only once every result is stored."""
    ids = [submit_echo(redis, settings, [i, i]) for i in range(8)]
    worker = BatchWorker({"echo": echo_runner(max_batch=4)}, connection=redis, settings=settings, name="late-finish")
    finish, execute = worker._finish, worker.execute_job
    states: list[bytes | None] = []
    finished_before: list[int] = []

    def slow_finish(*args: Any) -> None:
        time.sleep(0.5)  # the next batch is claimed, started and run meanwhile
        finish(*args)

    def record(job: JSONJob, queue: Any) -> None:
        execute(job, queue)
        states.append(redis.hget(worker.key, "state"))
        finished_before.append(redis.zcard("rq:finished:inferq.echo"))

    worker._finish = slow_finish  # type: ignore[method-assign]
    worker.execute_job = record  # type: ignore[method-assign]
    worker.work(burst=True)
    assert worker.batches_run == 2
    # Each batch returned with its own results still being stored (the second waited for the first's).
    assert finished_before == [0, 4]
    assert states == [b"busy", b"busy"]  # no finish wrote IDLE: the dequeue does, when nothing waits
    assert [get_job_view(redis, i)["status"] for i in ids] == ["finished"] * 8


def test_a_round_trip_count_leaves_out_a_new_connections_handshake(redis_url: str) -> None:
    """Whether a second pooled connection is opened depends on what another thread does at that moment: counting
    its CLIENT SETINFO made the count above read the clock ({1: 6, 16: 5} beside two busy loops)."""
    client = counting_client(redis_url)
    client.ping()  # the first connection, made and back in the pool
    before = CountingConnection.sent
    held = client.connection_pool.get_connection()  # another thread's, busy: the next command needs a new one
    try:
        client.ping()
    finally:
        client.connection_pool.release(held)
        client.close()
    assert CountingConnection.sent - before == 1


class _StopAfterTheBatch(BatchWorker):
    """A first SIGTERM that lands just after a batch, before the worker's next look at its queues says it is idle:
    RQ then only notes the stop (the worker still says busy), and ends it at its loop's next turn."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.blocking_claims: list[int | None] = []

    def _claim(self, timeout: int | None) -> tuple[str, Any] | None:
        if timeout is not None:  # it waits for a job now: the old code waited here, stop or not, until one came
            self.blocking_claims.append(timeout)
            raise StopRequested
        if self.batches_run == 1 and not self._stop_requested:
            self.request_stop(signal.SIGTERM, None)
        return super()._claim(timeout)


def test_a_stop_asked_as_a_batch_ends_is_not_held_until_the_next_job(redis: redis_py.Redis, settings: Settings) -> None:
    job_id = submit_echo(redis, settings, [1.0, 2.0])
    worker = _StopAfterTheBatch({"echo": echo_runner(4)}, connection=redis, settings=settings, name="stop-after")
    worker.work()
    assert worker.blocking_claims == []
    assert get_job_view(redis, job_id)["status"] == "finished"
    assert redis.smembers("rq:workers") == set()  # its death registered
