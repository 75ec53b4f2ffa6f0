"""Webhook delivery: one RQ job per attempt on the webhooks queue, sent by ``inferq webhooks``.

Retries follow ``Settings.webhook_retry_delays_s`` on connection errors, 5xx, 408 and 429
(a ``Retry-After`` header wins, capped); any other answer ends the delivery. Redirects are
not followed. Each attempt is appended to the job's webhook attempts list.

A sender killed mid-attempt leaves its delivery job in RQ's started registry; once its
heartbeat lapses, maintenance requeues it (the job carries RQ retries), so it is sent again.
"""

from __future__ import annotations

import json
import logging
import threading
from datetime import timedelta
from email.utils import parsedate_to_datetime
from typing import Any

import httpx
import redis
from redis import Redis
from rq import Queue, get_current_job
from rq.job import Retry
from rq.serializers import JSONSerializer
from rq.worker import SimpleWorker, WorkerStatus

from shared import keys, signing
from shared.errors import InvalidInput, NotFound
from shared.jobs import DELIVER_FUNC, WEBHOOK_CRASH_RETRIES, get_job_view, isoformat, utcnow
from shared.rqjson import JSONJob, JSONQueue
from shared.settings import Settings, get_settings
from shared.urls import check_webhook_target

log = logging.getLogger(__name__)
RETRYABLE_STATUS = {408, 429}
MAX_RETRY_AFTER_S = 3600.0


def deliver(job_id: str, attempt: int = 1) -> dict[str, Any]:
    """Send one attempt of a job's webhook; schedule the next one if it may succeed later."""
    current = get_current_job()
    if current is None:
        raise RuntimeError("deliver() runs inside an RQ job")
    settings = get_settings()
    connection: Redis = current.connection
    try:
        view = get_job_view(connection, job_id)
    except NotFound:
        return {"job_id": job_id, "attempt": attempt, "outcome": "job expired"}
    url = (view.get("webhook") or {}).get("url")
    if not url:
        return {"job_id": job_id, "attempt": attempt, "outcome": "no webhook"}
    view.pop("webhook", None)
    body = json.dumps(view, separators=(",", ":")).encode()
    secret = settings.webhook_secret.get_secret_value() if settings.webhook_secret else None
    # webhook-id stays the same across retries so receivers can deduplicate.
    headers = signing.headers(secret, f"msg_{job_id}", body)
    record: dict[str, Any] = {"attempt": attempt, "at": isoformat(utcnow())}
    retry_after: float | None = None
    try:
        # Again at delivery: the name may resolve elsewhere than it did at submit.
        check_webhook_target(url, settings.webhook_allow)
    except InvalidInput as exc:
        record |= {"error": exc.message, "outcome": "refused"}
        _record(connection, settings, job_id, record)
        return {"job_id": job_id, **record}
    try:
        with httpx.Client(timeout=settings.webhook_timeout_s, follow_redirects=False) as client:
            response = client.post(url, content=body, headers=headers)
        record["status_code"] = response.status_code
        retryable = response.status_code >= 500 or response.status_code in RETRYABLE_STATUS
        retry_after = _retry_after_s(response.headers.get("retry-after"))
        delivered = 200 <= response.status_code < 300
    except httpx.HTTPError as exc:
        record["error"] = f"{type(exc).__name__}: {exc}"[:300]
        retryable, delivered = True, False
    delays = settings.webhook_retry_delays_s
    if not delivered and retryable and attempt <= len(delays):
        delay = min(retry_after if retry_after is not None else delays[attempt - 1], MAX_RETRY_AFTER_S)
        record["next_attempt_in_s"] = delay
        _schedule(connection, settings, job_id, attempt + 1, delay)
    record["outcome"] = "delivered" if delivered else ("retrying" if "next_attempt_in_s" in record else "gave up")
    _record(connection, settings, job_id, record)
    log.info("webhook for %s attempt %d: %s", job_id, attempt, record["outcome"])
    return {"job_id": job_id, **record}


def _record(connection: Redis, settings: Settings, job_id: str, record: dict[str, Any]) -> None:
    attempts_key = keys.webhook_attempts_key(job_id)
    with connection.pipeline(transaction=True) as pipe:
        pipe.rpush(attempts_key, json.dumps(record))
        pipe.expire(attempts_key, settings.webhook_ttl_s)
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


def _schedule(connection: Redis, settings: Settings, job_id: str, attempt: int, delay_s: float) -> None:
    queue = JSONQueue(keys.WEBHOOK_QUEUE, connection=connection)
    queue.enqueue_in(
        timedelta(seconds=delay_s),
        DELIVER_FUNC,
        kwargs={"job_id": job_id, "attempt": attempt},
        ttl=settings.webhook_ttl_s,
        result_ttl=settings.webhook_ttl_s,
        failure_ttl=settings.webhook_ttl_s,
        job_timeout=int(settings.webhook_timeout_s) + 30,
        retry=Retry(max=WEBHOOK_CRASH_RETRIES),
        description=f"webhook for {job_id} (attempt {attempt})",
    )


class WebhookWorker(SimpleWorker):
    """RQ's SimpleWorker with the batching worker's short heartbeat, kept alive while an attempt runs.

    RQ's default heartbeat for a job is its timeout + 60 s, so a killed sender's delivery sat
    in the started registry for minutes. With ``heartbeat_ttl_s`` refreshed every third of
    it, maintenance (every ``maintenance_interval_s``) requeues it within a minute.
    """

    def __init__(self, *args: Any, settings: Settings, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.settings = settings

    def get_heartbeat_ttl(self, job: Any) -> int:
        return self.settings.heartbeat_ttl_s

    def execute_job(self, job: Any, queue: Queue) -> None:
        self.prepare_execution(job)
        stop = threading.Event()
        beat = threading.Thread(target=self._keep_alive, args=(job, stop), daemon=True)
        beat.start()
        try:
            self.perform_job(job, queue)
        finally:
            stop.set()
            beat.join()
        self.set_state(WorkerStatus.IDLE)

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
