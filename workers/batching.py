"""The batching worker: RQ's own loop, one forward pass per batch of whatever is waiting.

RQ's ``work()`` loop keeps registration, heartbeats, suspension, warm shutdown and
maintenance; it blocks for one job and calls ``execute_job``. We take that job, greedily pop
what else is already waiting on its queue (up to the model's ``max_batch``), mark them all
started in one transaction, run the model once, and finish them all in one transaction.
RQ's per-job helpers (``perform_job``, ``handle_job_success``) are never used: they cost
about 18 round trips per job.

Every write that moves a job is a script of ``shared.lifecycle``. Round trips per batch, in the
steady state: the worker's IDLE state, the blocking BLMOVE, one script that pops the rest, one MULTI
that starts and loads the batch, one MULTI that finishes it. The finish runs on a thread of its own
(``threads.Finisher``), so Redis stores one batch while this process loads the next. With the
overlap on (``INFERQ_OVERLAP``), the next batch is also prepared while the model runs (``prefetch``).
Which queue the next job comes from is the lane policy's decision (``lanes``); this module runs it.
"""

from __future__ import annotations

import contextlib
import logging
import math
import signal
import threading
import time
from collections.abc import Callable, Mapping
from datetime import datetime, timedelta
from typing import Any

import redis
from redis import Redis
from rq.exceptions import AbandonedJobError, DequeueTimeout
from rq.job import JobStatus
from rq.queue import Queue
from rq.serializers import JSONSerializer
from rq.utils import now, utcformat
from rq.worker import SimpleWorker, WorkerStatus

from inferq.shared import durability, keys, metrics, versions
from inferq.shared.connections import is_unavailable
from inferq.shared.lifecycle import bulk, claims, finish, layout
from inferq.shared.lifecycle.claims import Claimed
from inferq.shared.lifecycle.info import F
from inferq.shared.lifecycle.queues import register_queues
from inferq.shared.rqjson import JSONJob, JSONQueue
from inferq.shared.settings import Settings
from inferq.workers import traces
from inferq.workers.cpu_threads import tuner_for
from inferq.workers.fill import policy_for
from inferq.workers.lanes import LanePolicy
from inferq.workers.outage import CommandChannel, Outage, register_through
from inferq.workers.outcomes import chunk_outcome, outcome_of
from inferq.workers.prefetch import Prefetcher
from inferq.workers.running import (
    BatchReport,
    BatchTimeout,
    Item,
    ModelRunner,
    Prepared,
    prepare,
    run_batch,
    run_prepared,
)
from inferq.workers.threads import Finisher, KeepAlive

log = logging.getLogger(__name__)

# While a batch waits to fill, it looks for more jobs this often.
FILL_POLL_S = 0.001
# A drainer waiting for the jobs a dead worker held looks at its queues and registries again this often.
HELD_RECHECK_S = 1


class BatchWorker(SimpleWorker):
    """An RQ SimpleWorker that runs each model on batches of the jobs waiting for it."""

    queue_class = JSONQueue  # type: ignore[assignment]
    job_class = JSONJob
    # RQ calls heartbeat() and checks suspension several times per job; per batch is plenty.
    suspension_check_interval_s = 1.0
    # After a Redis outage, reconnect within seconds, not RQ's minute.
    max_connection_wait_time = 5.0

    def __init__(
        self,
        runners: dict[str, ModelRunner],
        *,
        connection: Redis,
        settings: Settings,
        max_wait_ms: float = 0.0,
        batch_wait: str | None = None,
        name: str | None = None,
    ) -> None:
        super().__init__(
            [keys.queue_name(model, lane) for lane in keys.LANES for model in runners],
            name=name,
            connection=connection,
            serializer=JSONSerializer,
            job_class=JSONJob,
            queue_class=JSONQueue,
            worker_ttl=settings.worker_ttl_s,
            maintenance_interval=settings.maintenance_interval_s,
            default_result_ttl=settings.result_ttl_s,
        )
        self.runners = runners
        self.settings = settings
        # Called once it is registered on its queues, i.e. it takes jobs from now on (inferq up's replacement of a
        # worker whose model changed waits for it: inferq/supervisor.py).
        self.on_registered: Callable[[], None] | None = None
        # Redis being down, full, busy or demoted is waited out (workers/outage.py): the main loop's and the
        # finisher thread's own backoffs.
        self.outage = Outage(f"worker {self.name}")
        self._finish_outage = Outage(f"worker {self.name} (storing results)")
        self._commands = CommandChannel(f"worker {self.name}")
        # How long a batch waits for more jobs once it holds what waits (workers/fill.py), per model.
        wait_policy = batch_wait or settings.batch_wait
        self.fill = {model: policy_for(wait_policy, max_wait_ms, model) for model in runners}
        self._running: tuple[list[Item], Queue] | None = None
        # Jobs popped into the intermediate list but not yet marked started: (queue, ids).
        self._held: tuple[Queue, list[str]] | None = None
        # A batch whose start lost Redis, ran or not: (queue, ids, the executions it would have), given back.
        self._lost: tuple[Queue, list[str], list[str]] | None = None
        self.lanes = LanePolicy(list(runners), settings.bulk_share, settings.bulk_anticipate_ms)
        # Several tenants: no one tenant's jobs alone roll a version back (shared/versions.py ``judge``).
        self.several_tenants = len(settings.tenant_list) > 1
        # SIGUSR1 (``drain``): serve what waits in its queues, then exit (a version removed from the repository).
        self.draining = False
        # A drainer started in place of a draining worker that died (``inferq worker --drain``): it also serves the
        # jobs the dead one held, once RQ's maintenance gives them back (their heartbeat lapses), before it exits.
        self.drains_held = False

        # Jobs RQ's cleanup is about to fail (a dead worker's, no retries left): announced once it has.
        self._abandoned: list[str] = []
        self.push_exc_handler(self._note_abandoned)

        self._heartbeat_every_s = max(1.0, settings.worker_ttl_s / 3)
        self._beats = KeepAlive(self._keep_alive, settings.heartbeat_ttl_s / 3)
        self._finisher = Finisher()
        self._suspension_checked_at = -math.inf
        self.batches_run = 0

        # The overlap: the next batch is prepared while the model runs the current one (module docstring).
        cuda = any(runner.device.type == "cuda" for runner in runners.values())
        self.tuner = tuner_for(settings.cpu_threads, cuda)  # INFERQ_CPU_THREADS (workers/cpu_threads.py)
        for runner in runners.values():
            runner.tuner = self.tuner
        self.overlap = settings.overlap == "on" or (settings.overlap == "auto" and cuda)
        self.prefetch = Prefetcher(
            connection=self.connection,
            runners=runners,
            claim=self._claim,
            stopping=lambda: self._stop_requested,
            outage=self.outage,
            worker_name=self.name,
        )

    @property
    def batches_prefetched(self) -> int:
        return self.prefetch.count

    # -- RQ loop, with fewer round trips ---------------------------------------------------
    def _set_connection(self, connection: Redis) -> Redis:
        """Keep the connection's short socket timeout: RQ raises it past its own blocking dequeue (which this
        worker never uses: its blocking waits are BLOCK_SLICE_S at most), and a frozen connection would then
        hang the worker for half a minute."""
        return connection

    def _set_ip_address(self, connection: Redis) -> None:
        """RQ names its connection in Redis as the worker is built: waited for through an outage too (a shard that
        is down when `inferq up` starts had its workers exit with a traceback, over and over)."""
        Outage(f"worker {self.name}").wait(lambda: super(BatchWorker, self)._set_ip_address(connection), "starting")

    def register_birth(self) -> None:
        def queues() -> None:
            register_queues(self.connection, self.queue_names())  # rq info lists an empty bulk lane too

        register_through(self.outage, self, super().register_birth, queues)
        if self.on_registered is not None:
            self.on_registered()

    def heartbeat(self, timeout: int | None = None, pipeline: Any = None) -> None:
        if pipeline is not None:
            super().heartbeat(timeout, pipeline=pipeline)
            return
        recent = self.last_heartbeat and (now() - self.last_heartbeat).total_seconds() < self._heartbeat_every_s
        if recent and timeout is None:
            return
        with self.connection.pipeline(transaction=False) as pipe:
            super().heartbeat(timeout, pipeline=pipe)
            self.outage.skip(pipe.execute, "sending a heartbeat")

    def check_for_suspension(self, burst: bool) -> None:
        if time.monotonic() - self._suspension_checked_at < self.suspension_check_interval_s:
            return
        self._suspension_checked_at = time.monotonic()
        self.outage.skip(lambda: super(BatchWorker, self).check_for_suspension(burst), "checking for suspension")

    def run_maintenance_tasks(self) -> None:
        self.outage.skip(super().run_maintenance_tasks, "running maintenance")

    def _note_abandoned(self, job: Any, exc_type: type, exc_value: BaseException, tb: Any) -> bool:
        """RQ's cleanup calls this before it retries or fails a dead worker's job; note the ones it will fail."""
        if exc_type is AbandonedJobError and not (job.retries_left and job.retries_left > 0):
            self._abandoned.append(job.id)
        return True  # fall through: RQ goes on to fail it as usual

    def clean_registries(self) -> None:
        """Jobs popped but never started (their worker died in between) back in their queues, where RQ's cleanup
        would fail them; RQ's maintenance; the event and webhook its failures never sent (every end is told)."""
        try:
            for queue in self.queues:
                if back := claims.rescue_stuck(self.connection, queue):
                    log.warning("worker %s: %d popped, never started job(s) put back: %s", self.name, len(back), back)
            super().clean_registries()
        finally:
            noted, self._abandoned = self._abandoned, []
            claims.announce_failed(self.connection, self.settings, noted)

    def handle_job_failure(self, job: Any, queue: Any, started_job_registry: Any = None, exc_string: str = "") -> None:
        """RQ's intermediate-list cleanup fails a job stuck there (put back twice already) this way: tell them too.

        A job canceled while it sat there (its worker died between the pop and the start) stays canceled.
        """
        if job.get_status(refresh=True) == JobStatus.CANCELED:
            return
        super().handle_job_failure(job, queue, started_job_registry=started_job_registry, exc_string=exc_string)
        claims.announce_failed(self.connection, self.settings, [job.id])

    def set_state(self, state: str, pipeline: Any = None) -> None:
        if pipeline is not None:
            super().set_state(state, pipeline=pipeline)
            return
        if state == self._state:
            return  # already written

        # What `rq info` shows it doing: while Redis is unavailable, left for the next change to write (RQ's
        # bootstrap writes "started" right after the registration, where a busy Redis used to end the worker).
        def write() -> bool:
            super(BatchWorker, self).set_state(state)
            return True

        if not self.outage.skip(write, f"saying it is {state}"):
            self._state = ""

    def subscribe(self) -> None:
        """RQ's channel for `rq` commands (stop, kill the running job), waited for through an outage."""
        self.outage.wait(super().subscribe, "subscribing to its command channel")

    def _pubsub_exception_handler(self, exc: Exception, pubsub: Any, pubsub_thread: Any) -> None:
        self._commands.lost(exc, pubsub)  # RQ's logged an ERROR every 2 s of an outage

    def teardown(self) -> None:
        """RQ registers the worker's death here: the last batch's results are stored first."""
        try:
            self._finisher.wait()
        except Exception:
            log.exception("worker %s: the last batch's results could not be stored", self.name)
        self.outage.skip(super().teardown, "registering its end")

    def drain(self, signum: int | None = None, frame: Any = None) -> None:
        """Serve every job waiting in this worker's queues, then exit, as a burst worker does (SIGUSR1): how
        `inferq up` unloads a model or version removed from the repository without dropping its queued jobs."""
        if not self.draining:
            log.info("worker %s: draining: it serves what waits in its queues, then exits", self.name)
        self.draining = True

    def work(self, *args: Any, **kwargs: Any) -> bool:
        """RQ's loop; whatever way it ends, a prefetched batch that will not run goes back to its queue."""
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGUSR1, self.drain)
        self.prefetch.open()  # a worker may work() again after a burst
        try:
            return bool(super().work(*args, **kwargs))
        finally:
            self.prefetch.close()
            self.outage.skip(self._take_back_lost, "giving back a batch")

    def dequeue_job_and_maintain_ttl(
        self, timeout: int | None, max_idle_time: int | None = None
    ) -> tuple[JSONJob, Queue] | None:
        """RQ's dequeue without its per-job fetch (execute_job loads the batch anyway), atomic for any queues.

        The worker says it is idle only when nothing waits: while batches follow one another it stays busy, and
        the round trip that said idle between them (queued behind the last batch's finish in Redis) is gone.
        """
        ready = self.prefetch.take()
        if ready is not None:
            # The batch after it is claimed, read and fed from now on, beside this one's start and run: with a fast
            # device, feeding it only once this one ran left the feeders idle through every start.
            self.prefetch.start()
            self._held = (ready.queue, ready.job_ids)
            self.outage.skip(self.heartbeat, "sending a heartbeat")
            return JSONJob(ready.job_ids[0], connection=self.connection), ready.queue
        self.procline(f"Listening on {','.join(q.name for q in self.queues)}")
        idle_since = now()
        idle_left = max_idle_time
        while True:
            try:
                self._take_back_lost()
                self.heartbeat()
                if self.should_run_maintenance_tasks:
                    self.run_maintenance_tasks()
                if timeout is not None and idle_left is not None:
                    timeout = min(timeout, idle_left)
                claimed = self._claim(None)  # what already waits
                # A burst or a draining worker ends at an empty queue; any other waits for work, saying so.
                if claimed is None and timeout is not None and not self.draining:
                    self.outage.skip(lambda: self.set_state(WorkerStatus.IDLE), "saying it is idle")
                    # A stop asked while it still said busy (a batch had just ended) was only noted: RQ looks at it
                    # after this returns, and waiting for a job first held the stop until one came.
                    if self._stop_requested:
                        return None
                    claimed = self._claim(timeout)
                elif claimed is None and self.drains_held and claims.any_started(self.connection, self.queue_names()):
                    claimed = self._claim(HELD_RECHECK_S)  # a timeout: look again (the maintenance above gives back)
                self.outage.ok()
                if claimed is None:
                    return None
                job_id, queue = claimed
                self._held = (queue, [job_id])
                return JSONJob(job_id, connection=self.connection), queue
            except DequeueTimeout:
                if max_idle_time is not None:
                    idle_left = math.ceil(max_idle_time - (now() - idle_since).total_seconds())
                    if idle_left <= 0:
                        return None
            except redis.exceptions.RedisError as exc:
                if not is_unavailable(exc):
                    raise
                time.sleep(self.outage.saw(exc, "waiting for work"))

    def _claim(self, timeout: int | None) -> tuple[str, Queue] | None:
        """The next job, moved into its queue's intermediate list in one step; None when empty (burst).

        Where it looks, in which order, is the lane policy's plan (``workers/lanes.py``); this runs it.
        """
        plan = self.lanes.plan()
        claimed = None
        if plan.anticipate:
            claimed = claims.claim(self.connection, plan.anticipate, None)
            if claimed is None and claims.any_waiting(self.connection, plan.bulk):
                with contextlib.suppress(DequeueTimeout):
                    claimed = claims.claim(self.connection, plan.anticipate, plan.anticipate_s, plan.block_on)
        if claimed is None:
            claimed = claims.claim(self.connection, plan.order, timeout, plan.block_on)
        if claimed is None:
            return None
        job_id, name = claimed
        queue = next(q for q in self.queues if q.name == name)
        self.lanes.claimed(name)
        return job_id, queue

    def get_heartbeat_ttl(self, job: JSONJob) -> int:  # type: ignore[override]
        # Short, and refreshed while a batch runs: a killed worker's jobs are found quickly.
        return self.settings.heartbeat_ttl_s

    def _shutdown(self) -> None:
        """A first SIGTERM/SIGINT while a batch is being collected: finish it, then stop.

        RQ stops at once unless the worker is BUSY, and ours is BUSY only once the batch starts:
        stopping while collecting would strand the popped jobs in the intermediate list.
        """
        if self._held is not None or self.prefetch.holding:
            self._stop_requested = True
            self.set_shutdown_requested_date()
            log.info("worker %s: stopping after the batch being collected", self.name)
            return
        super()._shutdown()

    def request_force_stop(self, signum: int, frame: Any) -> None:
        """A second SIGTERM/SIGINT: give the running or held batch back to its queue, then exit."""
        duplicate = self._shutdown_requested_date and now() - self._shutdown_requested_date < timedelta(seconds=1)
        if not duplicate:
            running, self._running = self._running, None
            held, self._held = self._held, None
            # The next batch first: the running one is then put back in front of it, in order.
            self.prefetch.give_back(wait_s=2.0)
            if running is not None:
                self._give_back(*running)
            elif held is not None:
                self._give_back_held(*held)
            with contextlib.suppress(Exception):  # a batch that ran keeps its results: they are being stored
                self._finisher.wait(timeout_s=10.0)
        super().request_force_stop(signum, frame)

    # -- one batch -------------------------------------------------------------------------
    def execute_job(self, job: JSONJob, queue: Queue) -> None:  # type: ignore[override]
        runner = self.runners[keys.model_from_queue(queue.name)]
        ready = self.prefetch.hand_over()
        if ready is not None and (ready.job_ids[0] != job.id or ready.queue.name != queue.name):
            ready = None  # never: the dequeue hands over what it took
        self._held = (queue, ready.job_ids if ready else [job.id])
        try:
            job_ids = ready.job_ids if ready else self._collect(queue, job.id, runner.max_batch)
            began = None if ready else time.perf_counter()  # the fill policy's batch-time curve
            # The worker is BUSY from here: RQ waits for the batch. A batch read ahead is started without its inputs.
            items = self._start(queue, job_ids, ready.inputs() if ready is not None else None)
        except redis.exceptions.RedisError as exc:
            if not is_unavailable(exc):
                raise
            # Not left to maintenance (a minute or more; longer if the start ran): see _take_back_lost.
            if self._lost is None and self._held is not None:
                self._lost = (*self._held, [])
            time.sleep(self.outage.saw(exc, "starting a batch"))
            return
        finally:
            self._held = None
        prepared = None
        # A batch prepared ahead runs as prepared unless the start dropped some of it.
        adopted = ready.adopt(items) if ready is not None else None
        if adopted is not None:
            items, prepared = adopted
        if items:
            self._run(runner, items, queue, prepared, began)
        self.batches_run += 1

    def _run(
        self,
        runner: ModelRunner,
        items: list[Item],
        queue: Queue,
        prepared: Prepared | None = None,
        began: float | None = None,
    ) -> None:
        """Run the batch and hand its finish to the finisher; ``began`` (perf_counter, before its start), where the
        worker collected it itself, times it for the fill policy's batch-time curve."""
        self._running = (items, queue)
        self._beats.begin((layout.queue_keys(queue.name), _jobs_of(items)))
        timeout_s = max((item.job.timeout or 0 for item in items), default=0) or self.settings.job_timeout_s
        traced = traces.begin(self.connection, self.settings, runner, items, queue.name, self.name)
        try:
            # RQ's own per-job mechanism (SIGALRM), for the batch as a whole: a hung forward pass ends.
            with self.death_penalty_class(timeout_s, BatchTimeout, job_id=items[0].job.id):
                if self.overlap or prepared is not None:
                    prepared = prepared or prepare(runner, items)
                    self.prefetch.start()  # the next batch is prepared while this one runs
                    report = run_prepared(runner, prepared)
                else:
                    report = run_batch(runner, items)
        except BatchTimeout:
            log.error("worker %s: batch of %d ran past the %d s job timeout", self.name, len(items), timeout_s)
            report = BatchReport(inference_ms=timeout_s * 1000.0)
            for item in items:
                if item.output is None and item.error is None:
                    item.fail(f"the batch ran past the job timeout of {timeout_s} s (INFERQ_JOB_TIMEOUT_S)")
        finally:
            self._beats.end()
            if traced is not None:
                traced.leave()
        for item in items:
            item.info[F.INFERENCE_MS] = f"{report.inference_ms:.3f}"
            if runner.weights_sha256 is not None:
                item.info[F.WEIGHTS] = runner.weights_sha256
        if report.padded_tokens:
            log.debug(
                "model %s: batch of %d in %d forward(s), %d tokens, padding waste %.1f%%",
                runner.config.name,
                len(items),
                report.forwards,
                report.tokens,
                100 * report.padding_waste,
            )
        self._running = None  # from here on a forced stop must not requeue: results are being stored
        if began is not None:
            self.fill[keys.model_from_queue(queue.name)].ran(len(items), time.perf_counter() - began)
        ended_at = now()
        self._finisher.submit(lambda: self._store(runner, items, queue, ended_at, traced, report))

    def _keep_alive(self, batch: tuple[layout.QueueKeys, list[Claimed]]) -> None:
        """While the model runs: keep the batch's started-registry entries, its jobs and this worker alive in Redis."""
        self.prefetch.expire()
        qk, jobs = batch
        ttl_s = self.settings.heartbeat_ttl_s
        try:
            with self.connection.pipeline(transaction=False) as pipe:
                claims.keep_alive(pipe, qk, jobs, ttl_s, self._running_job_ttl_s())
                pipe.hset(self.key, "last_heartbeat", utcformat(now()))
                pipe.expire(self.key, self.worker_ttl + 60)
                pipe.execute()
        except redis.exceptions.RedisError as exc:
            log.warning("worker %s: heartbeat failed (%s)", self.name, exc)

    def _give_back(self, items: list[Item], queue: Queue) -> None:
        """Put a batch that will not finish back at the front of its queue, as it was."""
        started = [(j.id, j.execution_id) for j in _jobs_of(items)]
        back = claims.give_back(self.connection, layout.queue_keys(queue.name), started, self.name)
        log.warning("worker %s: cold shutdown; %d job(s) given back to %s", self.name, len(back), queue.name)

    def _take_back_lost(self) -> None:
        """A batch whose start lost Redis back at the front of its queue, whether that start ran or not."""
        if self._lost is None:
            return
        queue, job_ids, execution_ids = self._lost
        back = claims.give_back_lost(self.connection, layout.queue_keys(queue.name), job_ids, execution_ids, self.name)
        self._lost = None
        log.warning("worker %s: %d job(s) whose start lost Redis given back to %s", self.name, len(back), queue.name)

    def _give_back_held(self, queue: Queue, job_ids: list[str]) -> None:
        """Put popped jobs that never started back at the front of their queue, in order (a prefetched batch is
        the prefetcher's to give back)."""
        back = claims.give_back_held(self.connection, layout.queue_keys(queue.name), job_ids)
        log.warning("worker %s: cold shutdown; %d held job(s) given back to %s", self.name, len(back), queue.name)

    def _store(
        self,
        runner: ModelRunner,
        items: list[Item],
        queue: Queue,
        ended_at: datetime,
        traced: traces.BatchTrace | None = None,
        report: BatchReport | None = None,
    ) -> None:
        """The finish, then (INFERQ_DURABILITY) its end events once a replica has the results: each retried on
        its own, so a confirmation that waits never runs the finish twice. Then the batch's spans end."""
        began = time.time_ns()
        events = self._retrying(lambda: self._finish(runner, items, queue, ended_at, report))
        if events:
            self._retrying(lambda: durability.release(self.connection, self.settings, events))
        if traced is not None and report is not None:
            try:
                traced.end(items, report, (began, time.time_ns()))
            except Exception:
                log.exception("tracing: the batch's spans could not end")

    def _retrying(self, write: Any, give_up_s: float = 300.0) -> Any:
        """Results already computed survive Redis being down, full or busy: keep trying to store them.

        Given up after ``give_up_s`` (or at once for an error Redis will repeat): the worker carries on, and the
        batch's jobs, still started, are run again by maintenance once their heartbeat lapses.
        """
        deadline = time.monotonic() + give_up_s
        while True:
            try:
                result = write()
                self._finish_outage.ok()
                return result
            except redis.exceptions.RedisError as exc:
                if not is_unavailable(exc):
                    log.exception("worker %s: Redis refused a batch's results; its jobs will run again", self.name)
                    return None
                if time.monotonic() > deadline:
                    log.error(
                        "worker %s: results not stored within %g s; the jobs will run again", self.name, give_up_s
                    )
                    return None
                time.sleep(self._finish_outage.saw(exc, "storing results"))

    def _collect(self, queue: Queue, first_id: str, max_batch: int) -> list[str]:
        """The first job plus what is already waiting; then, as the model's fill policy says, wait for more.

        Every wait is on the worker's own clock, from the pop of the first job: enqueued_at is the API host's clock,
        and a skewed one would stretch the wait (past a minute, RQ's cleanup would run the held jobs twice).
        """
        qk = layout.queue_keys(queue.name)
        if keys.is_chunk(first_id):
            return [first_id]  # a bulk chunk holds up to max_batch items: a batch of its own
        job_ids = [first_id, *claims.pop(self.connection, qk, max_batch - 1)]
        self._held = (queue, job_ids)
        policy = self.fill[keys.model_from_queue(queue.name)]
        wait = None if self.draining else policy.plan(len(job_ids), max_batch)
        if wait is None:
            return job_ids
        began = time.monotonic()
        arrivals: list[float] = []
        while len(job_ids) < max_batch and not self._stop_requested:
            left = began + wait.total_s - time.monotonic()
            if left <= 0:
                break
            time.sleep(min(FILL_POLL_S, left))
            more = claims.pop(self.connection, qk, max_batch - len(job_ids))
            if more:
                arrivals.append(time.monotonic() - began)
                job_ids += more
                self._held = (queue, job_ids)
        policy.waited(arrivals, time.monotonic() - began)
        return job_ids

    def _start(self, queue: Queue, job_ids: list[str], read: Mapping[str, bytes | None] | None = None) -> list[Item]:
        """Start the popped jobs and load them, in one transaction with the worker's BUSY state; ``read``: their
        inputs by id, read ahead (the prefetch), so the start does not carry them back again.

        The start script drops what must not run (canceled, no longer queued, expired) atomically:
        a cancel lands either before it (the job is dropped) or after (the job is canceled while running).
        """
        heartbeat_ttl = self.settings.heartbeat_ttl_s
        qk = layout.queue_keys(queue.name)
        ttl = self._running_job_ttl_s()
        with self.connection.pipeline(transaction=True) as pipe:
            call = claims.start(pipe, self.settings, qk, job_ids, self.name, heartbeat_ttl, ttl, inputs=read is None)
            # No current_job on the worker's hash: rq-dashboard reads that job with pickle whatever its
            # --json says, and its workers page fails on a JSON job. The started registry names the batch.
            self.set_state(WorkerStatus.BUSY, pipeline=pipe)
            self.heartbeat(heartbeat_ttl, pipeline=pipe)
            self._lost = (queue, job_ids, call.execution_ids)  # until the reply is read: the start may have run
            result = claims.started(call, pipe.execute())
            self._lost = None
        if result.events:  # expiries told once confirmed (INFERQ_DURABILITY); on failure their clients re-read
            self.outage.skip(
                lambda: durability.release(self.connection, self.settings, result.events), "telling expiries"
            )
        if result.vanished or result.expired:
            log.warning(
                "worker %s: %d job(s) expired before they started; dropped: %s",
                self.name,
                len(result.vanished) + len(result.expired),
                sorted(result.vanished + result.expired),
            )
        if result.dropped:
            log.info("worker %s: %d canceled job(s) dropped from the batch", self.name, len(result.dropped))
        items = []
        for job in result.jobs:
            if read is not None:
                job.payload = read.get(job.id)
            if F.BATCH not in job.info:
                items.append(Item(job, job.payload, job.info.get(F.CONTENT_TYPE, "")))
                continue
            try:
                chunk = bulk.decode_chunk(job.payload or b"")
            except (ValueError, KeyError, TypeError) as exc:  # never written by inferq's API
                log.error("worker %s: bulk chunk %s is unreadable (%s)", self.name, job.id, exc)
                chunk = []
            items += [Item(job, i.payload, i.content_type, custom_id=i.custom_id, trace=i.trace) for i in chunk]
        return items

    def _running_job_ttl_s(self) -> int:
        """A running job's hash outlives the job's timeout; the keep-alive extends it while the batch runs."""
        return claims.running_job_ttl_s(self.settings)

    def _finish(
        self, runner: ModelRunner, items: list[Item], queue: Queue, ended_at: datetime, report: BatchReport | None
    ) -> list[bytes]:
        """Store every result, move registries, publish events and queue webhooks: one transaction.

        Runs on the finisher's thread, maybe while the next batch starts: it leaves the worker's state alone
        (the dequeue before the next claim writes IDLE, a start BUSY), so a late finish never says IDLE while
        the next batch runs.
        """
        outcomes = []
        chunks: dict[str, list[Item]] = {}
        for item in items:
            item.job.ended_at = ended_at
            if item.custom_id is None:
                outcomes.append(outcome_of(item, len(items), runner.config.served, self.name, self.settings))
            else:
                chunks.setdefault(item.job.id, []).append(item)
        outcomes += [
            chunk_outcome(chunk, len(items), runner.config, self.name, self.settings) for chunk in chunks.values()
        ]
        working_s = (ended_at - items[0].job.started_at).total_seconds()
        with self.connection.pipeline(transaction=True) as pipe:
            qk = layout.queue_keys(queue.name)
            padding = (report.tokens, report.padded_tokens) if report is not None else (0, 0)
            batch = metrics.batch_increments(len(items), *padding)
            call = finish.finish(pipe, self.settings, qk, outcomes, self.name, self.key, working_s, batch)
            vanished, superseded, events = finish.finished(call, pipe.execute())
        if runner.judged:
            # The model's verdicts only: an item refused as bad input is the client's, never the version's.
            judged = [(i.error is not None, i.job.info.get(F.TENANT, "")) for i in items if not i.input_refused]
            weights = runner.weights_sha256
            reason = versions.judge(self.connection, runner.config, judged, weights, self.several_tenants)
            if reason is not None:
                log.error(
                    "model %s version %d is rolled back: %s; unpinned jobs go to its other versions",
                    runner.config.name,
                    runner.config.version,
                    reason,
                )
        if vanished:
            log.warning(
                "worker %s: %d job(s) expired while running; results dropped: %s", self.name, len(vanished), vanished
            )
        if superseded:
            log.info(
                "worker %s: %d job(s) canceled or taken over while running; results dropped: %s",
                self.name,
                len(superseded),
                superseded,
            )
        return events


def _jobs_of(items: list[Item]) -> list[Claimed]:
    """The batch's jobs, once each: the items of a bulk chunk share theirs."""
    return list({id(item.job): item.job for item in items}.values())
