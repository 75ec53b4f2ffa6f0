"""Webhook delivery: one RQ job per attempt on the webhooks queue, sent by ``inferq webhooks``.

Retries follow ``Settings.webhook_retry_delays_s`` on connection errors, timeouts, 5xx, 408
and 429 (a ``Retry-After`` header wins, capped); any other answer ends the delivery. Redirects
are not followed. Each attempt is appended to the job's webhook attempts list.

An attempt is bounded: ``webhook_timeout_s`` covers the DNS lookup, connect, TLS, sending and
the whole answer, and at most ``RESPONSE_BYTES_MAX`` of the answer's body is read. The host is
resolved once, checked (shared/urls.py), and the connection goes to the checked address.
A sender killed mid-attempt leaves its delivery job in RQ's started registry; once its
heartbeat lapses, maintenance requeues it (the job carries RQ retries), so it is sent again.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import socket
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import timedelta
from email.utils import parsedate_to_datetime
from typing import Any

import httpcore
import httpx
import redis
from redis import Redis
from rq import Queue, get_current_job
from rq.defaults import DEFAULT_LOGGING_DATE_FORMAT, DEFAULT_LOGGING_FORMAT
from rq.exceptions import DequeueTimeout
from rq.serializers import JSONSerializer
from rq.worker import SimpleWorker, WorkerStatus

from inferq.shared import durability, keys, metrics, signing, tracing
from inferq.shared.connections import is_unavailable
from inferq.shared.errors import InvalidInput, NotFound
from inferq.shared.jobs import get_job_view, isoformat, utcnow
from inferq.shared.lifecycle import bulk, layout
from inferq.shared.lifecycle.queues import register_queues
from inferq.shared.rqjson import JSONJob, JSONQueue
from inferq.shared.settings import Settings, get_settings
from inferq.shared.urls import IPAddress, check_addresses, resolve_in_time, webhook_origin
from inferq.shared.view import encode_view
from inferq.workers import traces
from inferq.workers.outage import CommandChannel, Outage, register_through
from inferq.workers.scheduler import Scheduler

log = logging.getLogger(__name__)
RETRYABLE_STATUS = {408, 429}
MAX_RETRY_AFTER_S = 3600.0
# Enough to see a receiver's status and a short error; a receiver cannot make us hold more.
RESPONSE_BYTES_MAX = 4096
# An end not yet confirmed on a replica (INFERQ_DURABILITY): its delivery looks again this much later.
UNCONFIRMED_RETRY_S = 1.0


def deliver(job_id: str | None = None, attempt: int = 1) -> dict[str, Any]:
    """Send one attempt of a job's or a bulk batch's webhook; schedule the next one if it may succeed later.

    The first attempt is queued by the job-lifecycle store without arguments: its RQ job id names the
    subject (``layout.delivered_subject``: a job's id, or ``layout.BATCH_SUBJECT`` + a batch's id). Later attempts
    are scheduled with the same subject (``job_id``, the name RQ stores them under) and their attempt.
    """
    current = get_current_job()
    if current is None:
        raise RuntimeError("deliver() runs inside an RQ job")
    subject = job_id or layout.delivered_subject(current.id)
    kind, job_id = layout.subject_of(subject)
    settings = get_settings()
    connection: Redis = current.connection
    if kind == "batch":
        batch = bulk.read_batch(connection, job_id)
        if batch is None:
            return {"job_id": job_id, "attempt": attempt, "outcome": "batch expired"}
        url = batch.pop("webhook", None)
        body = json.dumps(batch, separators=(",", ":")).encode()
    else:
        try:
            view = get_job_view(connection, job_id)
        except NotFound:
            return {"job_id": job_id, "attempt": attempt, "outcome": "job expired"}
        url = (view.get("webhook") or {}).get("url")
        # The job as GET /v1/jobs/{id} shows it now, to the byte: its webhook too, with the attempts before this one.
        body = encode_view(view)
    if not url:
        return {"job_id": job_id, "attempt": attempt, "outcome": "no webhook"}
    if durability.defers(settings) and durability.confirm_all(connection, settings) is not None:
        # INFERQ_DURABILITY: the end it tells is not confirmed on a replica (or disk) yet, and an end is told only once
        # it is, as its event is (shared/durability.py). No attempt is spent: it waits until the job's record expires.
        log.info("webhook for %s: waiting until a replica has the job's end (%s)", job_id, settings.durability)
        _schedule(connection, settings, subject, attempt, UNCONFIRMED_RETRY_S)
        return {"job_id": job_id, "attempt": attempt, "outcome": "waiting for a replica"}
    secret = settings.webhook_secret.get_secret_value() if settings.webhook_secret else None
    # webhook-id stays the same across retries so receivers can deduplicate.
    headers = signing.headers(secret, f"msg_{job_id}", body)
    record: dict[str, Any] = {"attempt": attempt, "at": isoformat(utcnow())}
    span = traces.webhook_span(connection, job_id, attempt) if kind == "job" else None
    if span is not None:
        headers.update(tracing.carrier(span.span))  # the receiver's work joins the job's trace
    try:
        sent_at = time.perf_counter()
        with Deadline(settings.webhook_timeout_s) as deadline:
            answer = send(url, body, headers, settings.webhook_allow, deadline)
        took_s = time.perf_counter() - sent_at
        if answer.refused:
            record |= {"error": answer.error, "outcome": "refused"}
            _record(connection, settings, job_id, record, took_s)
            return {"job_id": job_id, **record}
        if answer.error is not None:
            record["error"] = answer.error
            retryable, delivered = True, False
        else:
            assert answer.status_code is not None
            record |= {"status_code": answer.status_code, "response_bytes": answer.response_bytes}
            retryable = answer.status_code >= 500 or answer.status_code in RETRYABLE_STATUS
            delivered = 200 <= answer.status_code < 300
        delays = settings.webhook_retry_delays_s
        if not delivered and retryable and attempt <= len(delays):
            retry_after = answer.retry_after_s
            delay = min(retry_after if retry_after is not None else delays[attempt - 1], MAX_RETRY_AFTER_S)
            record["next_attempt_in_s"] = delay
            _schedule(connection, settings, subject, attempt + 1, delay)
        record["outcome"] = "delivered" if delivered else ("retrying" if "next_attempt_in_s" in record else "gave up")
        _record(connection, settings, job_id, record, took_s)
        log.info("webhook for %s attempt %d: %s", job_id, attempt, record["outcome"])
    finally:
        if span is not None:
            span.end(record)
    return {"job_id": job_id, **record}


@dataclass(frozen=True)
class Answer:
    """What one attempt came to: a status, or an error (refused: never to be retried)."""

    status_code: int | None = None
    response_bytes: int = 0
    retry_after_s: float | None = None
    error: str | None = None
    refused: bool = False


class Deadline:
    """One attempt's whole time budget, and a watchdog that ends the attempt when it runs out.

    httpx's timeouts apply to each socket operation, so a receiver sending a byte every 0.2 s
    never trips a 1 s timeout. At the deadline the watchdog shuts the attempt's sockets down,
    which ends whatever read or write is in progress (TLS handshake included).
    """

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self._ends = time.monotonic() + seconds
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()
        self._fired = False
        self._timer = threading.Timer(seconds, self._fire)
        self._timer.daemon = True

    def __enter__(self) -> Deadline:
        self._timer.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._timer.cancel()

    def left_s(self) -> float:
        return max(0.0, self._ends - time.monotonic())

    @property
    def passed(self) -> bool:
        return self._fired or time.monotonic() >= self._ends

    def watch(self, sock: socket.socket) -> None:
        with self._lock:
            self._sockets.append(sock)
            fired = self._fired
        if fired:
            _shut(sock)

    def _fire(self) -> None:
        with self._lock:
            self._fired = True
            sockets = list(self._sockets)
        for sock in sockets:
            _shut(sock)


def _shut(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)


class PinnedBackend(httpcore.NetworkBackend):
    """Connects to the addresses that were checked, whatever the host name resolves to by now.

    httpcore would resolve the name again when connecting: a DNS answer that changed since the
    check (rebinding) would reach 127.0.0.1. TLS still verifies the certificate for the name,
    which httpcore passes to ``start_tls`` itself, and the Host header keeps the name.
    """

    def __init__(self, addresses: Iterable[IPAddress], deadline: Deadline) -> None:
        self._addresses = list(addresses)
        self._deadline = deadline
        self._tcp = httpcore.SyncBackend()

    def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.NetworkStream:
        error: Exception = httpcore.ConnectError(f"no address to connect to for {host}")
        for address in self._addresses:
            left_s = self._deadline.left_s()
            if left_s <= 0:
                raise httpcore.ConnectTimeout("the delivery's time ran out while connecting")
            try:
                stream = self._tcp.connect_tcp(
                    str(address), port, min(timeout or left_s, left_s), local_address, socket_options
                )
            except (httpcore.ConnectError, httpcore.ConnectTimeout) as exc:
                error = exc  # try the host's next address, as socket.create_connection would
                continue
            self._deadline.watch(stream.get_extra_info("socket"))
            return stream
        raise error

    def connect_unix_socket(
        self, path: str, timeout: float | None = None, socket_options: Iterable[Any] | None = None
    ) -> httpcore.NetworkStream:
        raise httpcore.ConnectError("webhooks are delivered over TCP only")


class PinnedTransport(httpx.HTTPTransport):
    """httpx's transport over a ``PinnedBackend``: no proxy, which would resolve the name itself."""

    def __init__(self, addresses: Iterable[IPAddress], deadline: Deadline) -> None:
        super().__init__(trust_env=False)
        # httpx takes no network backend of its own: the pool it built is replaced by one that uses ours.
        self._pool = httpcore.ConnectionPool(
            ssl_context=httpx.create_ssl_context(),  # SSL_CERT_FILE / SSL_CERT_DIR still apply
            max_connections=1,
            network_backend=PinnedBackend(addresses, deadline),
        )


def send(url: str, body: bytes, headers: dict[str, str], allow: Iterable[str], deadline: Deadline) -> Answer:
    """One POST to a checked address of the URL's host, within ``deadline``; never raises for the receiver."""
    try:
        host, port = webhook_origin(url)
    except InvalidInput as exc:
        return Answer(error=exc.message, refused=True)
    try:
        addresses = resolve_in_time(host, port, deadline.left_s())
    except TimeoutError:
        return Answer(error=f"could not resolve webhook host {host!r} within {deadline.seconds:g} s")
    except OSError:
        return Answer(error=f"webhook host {host!r} does not resolve")
    try:
        # Again at delivery: the name may resolve elsewhere than it did at submit.
        check_addresses(host, addresses, allow)
    except InvalidInput as exc:
        return Answer(error=exc.message, refused=True)
    try:
        with (
            httpx.Client(
                transport=PinnedTransport(addresses, deadline),
                timeout=deadline.seconds,
                follow_redirects=False,
                trust_env=False,
            ) as client,
            client.stream("POST", url, content=body, headers=headers) as response,
        ):
            read = 0
            # Raw: a compressed answer is not inflated. Chunks are at most httpcore's 64 KiB reads.
            for chunk in response.iter_raw():
                read += len(chunk)
                if read >= RESPONSE_BYTES_MAX:
                    break  # leaving the block closes the connection with the rest unread
    except httpx.HTTPError as exc:
        if deadline.passed or isinstance(exc, httpx.TimeoutException):
            return Answer(error=f"timed out: no complete answer within {deadline.seconds:g} s")
        return Answer(error=f"{type(exc).__name__}: {exc}"[:300])
    return Answer(
        status_code=response.status_code,
        response_bytes=min(read, RESPONSE_BYTES_MAX),
        retry_after_s=_retry_after_s(response.headers.get("retry-after")),
    )


def _record(connection: Redis, settings: Settings, job_id: str, record: dict[str, Any], took_s: float) -> None:
    """The attempt in the job's list, and counted in the cluster's metrics, in one round trip."""
    attempts_key = keys.webhook_attempts_key(job_id)
    outcome = {"delivered": "delivered", "retrying": "retrying"}.get(record["outcome"], "gave_up")  # refused too
    counted: metrics.Increments = {}
    metrics.count(counted, "outcome", outcome)
    metrics.observe(counted, metrics.WEBHOOK_HISTOGRAM, took_s, metrics.TIME_BUCKETS_S)
    with connection.pipeline(transaction=True) as pipe:
        pipe.rpush(attempts_key, json.dumps(record))
        pipe.expire(attempts_key, settings.webhook_ttl_s)
        for name, value in counted.items():
            pipe.hincrbyfloat(keys.WEBHOOK_METRICS_KEY, name, value)
        pipe.expire(keys.WEBHOOK_METRICS_KEY, metrics.TOTALS_TTL_S)
        pipe.execute()


def _retry_after_s(value: str | None) -> float | None:
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        return max(0.0, (parsedate_to_datetime(value) - utcnow()).total_seconds())
    except (TypeError, ValueError):
        return None


def _schedule(connection: Redis, settings: Settings, subject: str, attempt: int, delay_s: float) -> None:
    queue = JSONQueue(keys.WEBHOOK_QUEUE, connection=connection)
    queue.enqueue_in(
        timedelta(seconds=delay_s),
        layout.DELIVER_FUNC,
        kwargs={"job_id": subject, "attempt": attempt},
        description=f"webhook for {subject} (attempt {attempt})",
        **_scheduled_options(settings),
    )


def _scheduled_options(settings: Settings) -> dict[str, Any]:
    """The first delivery's RQ options (``layout.delivery_options``) in ``enqueue_in``'s spelling."""
    options = layout.delivery_options(settings.webhook_ttl_s, settings.webhook_timeout_s)
    options["job_timeout"] = options.pop("timeout")
    return options


class WebhookWorker(SimpleWorker):
    """RQ's SimpleWorker with the batching worker's short heartbeat, kept alive while an attempt runs.

    RQ's default heartbeat for a job is its timeout + 60 s, so a killed sender's delivery sat
    in the started registry for minutes. With ``heartbeat_ttl_s`` refreshed every third of
    it, maintenance (every ``maintenance_interval_s``) requeues it within a minute.
    """

    # RQ's blocking dequeue waits this long per call, and the socket timeout must outlast it: short, so a
    # connection that died silently is noticed in seconds (RQ's own default would be half a minute).
    dequeue_timeout = 5  # type: ignore[assignment]
    connection_timeout = dequeue_timeout + 2  # type: ignore[assignment]

    def __init__(self, *args: Any, settings: Settings, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.settings = settings
        # Redis being down, full, busy or demoted is waited out (workers/outage.py), never a reason to quit.
        self.outage = Outage(f"webhook sender {self.name}")
        self._commands = CommandChannel(f"webhook sender {self.name}")

    def _set_ip_address(self, connection: Any) -> None:
        """RQ names its connection in Redis as the worker is built: waited for through an outage too (a sender of a
        shard that is down when `inferq up` starts exited with a traceback, over and over)."""
        who = f"webhook sender {self.name}"
        Outage(who).wait(lambda: super(WebhookWorker, self)._set_ip_address(connection), "starting")

    def get_heartbeat_ttl(self, job: Any) -> int:
        return self.settings.heartbeat_ttl_s

    def register_birth(self) -> None:
        def queues() -> None:
            register_queues(self.connection, self.queue_names())  # rq info lists the sender before any webhook

        register_through(self.outage, self, super().register_birth, queues)

    def heartbeat(self, timeout: int | None = None, pipeline: Any = None) -> None:
        if pipeline is not None:
            super().heartbeat(timeout, pipeline=pipeline)
            return
        self.outage.skip(lambda: super(WebhookWorker, self).heartbeat(timeout), "sending a heartbeat")

    def check_for_suspension(self, burst: bool) -> None:
        self.outage.skip(lambda: super(WebhookWorker, self).check_for_suspension(burst), "checking for suspension")

    def run_maintenance_tasks(self) -> None:
        self.outage.skip(super().run_maintenance_tasks, "running maintenance")

    def _pubsub_exception_handler(self, exc: Exception, pubsub: Any, pubsub_thread: Any) -> None:
        self._commands.lost(exc, pubsub)  # RQ's logged an ERROR every 2 s of an outage

    def _start_scheduler(
        self,
        burst: bool = False,
        logging_level: str | None = "INFO",
        date_format: str = DEFAULT_LOGGING_DATE_FORMAT,
        log_format: str = DEFAULT_LOGGING_FORMAT,
    ) -> None:
        """RQ's, with a scheduler that waits out an unavailable Redis (workers/scheduler.py) where RQ's died."""
        scheduler = Scheduler(
            self.queues,
            connection=self.connection,
            logging_level=logging_level if logging_level is not None else self.log.level,
            date_format=date_format,
            log_format=log_format,
            serializer=self.serializer,
        )
        self.scheduler = scheduler
        # RQ takes its scheduler locks before its loop, outside every hook above: a sender that started while Redis
        # was full or busy quit there. Skipped, the scheduler (retries) is started by maintenance once Redis is back.
        self.outage.skip(lambda: scheduler.take_up(burst), "starting its scheduler")

    def dequeue_job_and_maintain_ttl(self, timeout: int | None, max_idle_time: int | None = None) -> Any:
        """RQ's dequeue (its heartbeat, maintenance, then a blocking pop), waiting out an unavailable Redis.

        RQ's own loop retried a refused connection itself, with an ERROR line each time (a failover's whole window),
        and ended the process on anything else Redis said; here either is one line when lost and one when back.
        """
        self.outage.skip(lambda: self.set_state(WorkerStatus.IDLE), "saying it is idle")
        self.procline(f"Listening on {','.join(self.queue_names())}")
        idle_since = time.monotonic()
        while True:
            if timeout is not None and max_idle_time is not None:
                timeout = max(1, min(timeout, math.ceil(max_idle_time - (time.monotonic() - idle_since))))
            try:
                self.heartbeat()
                if self.should_run_maintenance_tasks:
                    self.run_maintenance_tasks()
                result = self.queue_class.dequeue_any(
                    self._ordered_queues,
                    timeout,
                    connection=self.connection,
                    job_class=self.job_class,
                    serializer=self.serializer,
                    death_penalty_class=self.death_penalty_class,
                )
            except DequeueTimeout:
                if max_idle_time is not None and time.monotonic() - idle_since >= max_idle_time:
                    return None
                continue
            except redis.exceptions.RedisError as exc:
                if not is_unavailable(exc):
                    raise
                time.sleep(self.outage.saw(exc, "waiting for webhooks"))
                continue
            self.outage.ok()
            if result is not None:
                job, queue = result
                self.reorder_queues(reference_queue=queue)
                self.log.info("Worker %s: %s: %s", self.name, queue.name, job.id)
            self.heartbeat()
            return result

    def teardown(self) -> None:
        self.outage.skip(super().teardown, "registering its end")

    def set_current_job_id(self, job_id: str | None = None, pipeline: Any = None) -> None:
        # Never names the delivery: rq-dashboard reads a worker's current job with pickle whatever its
        # --json says, and its workers page fails on a JSON job. The started registry names it.
        super().set_current_job_id(None, pipeline=pipeline)

    def execute_job(self, job: Any, queue: Queue) -> None:
        try:
            self.prepare_execution(job)
        except redis.exceptions.RedisError as exc:
            if not is_unavailable(exc):
                raise
            # The delivery waits in RQ's intermediate list, where maintenance puts it back (at least once).
            time.sleep(self.outage.saw(exc, "starting a delivery"))
            return
        stop = threading.Event()
        beat = threading.Thread(target=self._keep_alive, args=(job, stop), daemon=True)
        beat.start()
        try:
            # Not run again here if Redis fails while its attempt is recorded: maintenance requeues it (at least once).
            self.outage.skip(lambda: self.perform_job(job, queue), "recording a delivery")
        finally:
            stop.set()
            beat.join()
        self.outage.skip(lambda: self.set_state(WorkerStatus.IDLE), "saying it is idle")

    def _keep_alive(self, job: Any, stop: threading.Event) -> None:
        while not stop.wait(self.settings.heartbeat_ttl_s / 3):
            try:
                self.maintain_heartbeats(job)
            except redis.exceptions.RedisError as exc:
                log.warning("webhook sender %s: heartbeat failed (%s)", self.name, exc)


def webhook_worker(connection: Redis, settings: Settings, name: str | None = None) -> WebhookWorker:
    """The RQ worker that sends webhooks; run it with ``work(with_scheduler=True)`` for retries."""
    return WebhookWorker(
        [JSONQueue(keys.WEBHOOK_QUEUE, connection=connection)],
        connection=connection,
        name=name,
        serializer=JSONSerializer,
        job_class=JSONJob,
        queue_class=JSONQueue,
        worker_ttl=settings.worker_ttl_s,
        maintenance_interval=settings.maintenance_interval_s,
        default_result_ttl=settings.webhook_ttl_s,
        settings=settings,
    )
