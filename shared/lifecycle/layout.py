"""RQ's storage layout as inferq writes it: key names, and the webhook delivery job's hash.

Key names come from RQ's own classes, so ``rq info``, rq-dashboard and ``Job.fetch`` read what
inferq writes exactly as they read what RQ writes. ``shared.rqjson.check_rq_version`` refuses to
start against an rq outside the range this layout was written for.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from functools import lru_cache
from types import MappingProxyType
from typing import Any

from redis import Redis
from rq.job import Retry
from rq.registry import CanceledJobRegistry, FailedJobRegistry, FinishedJobRegistry, StartedJobRegistry
from rq.results import Result
from rq.serializers import JSONSerializer
from rq.worker_registration import WORKERS_BY_QUEUE_KEY

from inferq.shared import keys
from inferq.shared.rqjson import JSONJob, JSONQueue

DELIVER_FUNC = "inferq.workers.webhooks.deliver"
INFER_FUNC = "inferq.workers.tasks.infer"
# Times a delivery is run again if the sender running it dies (SIGKILL, OOM): at-least-once.
WEBHOOK_CRASH_RETRIES = 3
DELIVERY_PREFIX = keys.DELIVERY_PREFIX
QUEUES_SET = JSONQueue.redis_queues_keys
# Objects built only to read key names from RQ's classes; they never send a command.
_OFFLINE = Redis()


def job_key(job_id: str) -> str:
    return JSONJob.key_for(job_id)


def result_key(job_id: str) -> str:
    return Result.get_key(job_id)


def workers_key(queue_name: str) -> str:
    """RQ's set of the workers registered on a queue (their hashes' keys), as rq.worker_registration names it."""
    return WORKERS_BY_QUEUE_KEY % queue_name


def delivery_key(job_id: str) -> str:
    return job_key(DELIVERY_PREFIX + job_id)


# A bulk batch's own webhook is queued for the subject BATCH_SUBJECT + the batch's id (announce.lua's
# batch_end_if_done prepends the same text), so a delivery's id says whether it is a job's or a batch's. No job or
# batch id starts with it: it is the chunks' prefix, which shards.new_id never hands out.
BATCH_SUBJECT = keys.CHUNK_PREFIX


def batch_delivery_key(batch_id: str) -> str:
    return delivery_key(BATCH_SUBJECT + batch_id)


def delivered_subject(delivery_id: str) -> str:
    """The subject a first delivery was queued for: a job's id, or BATCH_SUBJECT + a batch's id."""
    return delivery_id.removeprefix(DELIVERY_PREFIX)


def subject_of(subject: str) -> tuple[str, str]:
    """("batch", its id) for a batch's delivery subject, else ("job", its id)."""
    if subject.startswith(BATCH_SUBJECT):
        return "batch", subject.removeprefix(BATCH_SUBJECT)
    return "job", subject


@lru_cache(maxsize=256)
def offline_queue(name: str) -> JSONQueue:
    """A queue object that only builds jobs (``create_job``, ``to_dict``); the scripts write them."""
    return JSONQueue(name, connection=_OFFLINE)


# With several tenants, a queue's RQ list holds the first this many jobs of its fair order, the rest wait in its
# backlog (lua/lib/fair.lua): a placement reads at most this much of the list.
FAIR_WINDOW = 1000


@dataclass(frozen=True)
class QueueKeys:
    """One queue's list and registries, and its fair order's keys (lua/lib/fair.lua)."""

    name: str
    queue: str
    intermediate: str
    started: str
    finished: str
    failed: str
    canceled: str
    fair_tags: str
    fair_state: str
    fair_backlog: str


@lru_cache(maxsize=256)
def queue_keys(name: str) -> QueueKeys:
    queue = offline_queue(name)
    args: dict[str, Any] = {"connection": _OFFLINE, "job_class": JSONJob, "serializer": JSONSerializer}
    return QueueKeys(
        name=name,
        queue=queue.key,
        intermediate=queue.intermediate_queue_key,
        started=StartedJobRegistry(name, **args).key,
        finished=FinishedJobRegistry(name, **args).key,
        failed=FailedJobRegistry(name, **args).key,
        canceled=CanceledJobRegistry(name, **args).key,
        fair_tags=keys.fair_tags_key(name),
        fair_state=keys.fair_state_key(name),
        fair_backlog=keys.fair_backlog_key(name),
    )


def hooks() -> QueueKeys:
    return queue_keys(keys.WEBHOOK_QUEUE)


def delivery_options(ttl_s: int, timeout_s: float) -> dict[str, Any]:
    """RQ's options for every delivery attempt of a webhook."""
    return {
        "ttl": ttl_s,
        "result_ttl": ttl_s,
        "failure_ttl": ttl_s,
        "timeout": int(timeout_s) + 30,
        "retry": Retry(max=WEBHOOK_CRASH_RETRIES),
    }


def queued_job_fields(queue_name: str, func: str, *, drop: tuple[str, ...] = (), **options: Any) -> dict[str, Any]:
    """RQ's job hash for a job of ``func`` with RQ's ``options``, as RQ's own enqueue writes it, less its
    timestamps (and ``drop``): the one template every script that creates jobs copies (the scripts add the
    key and the timestamps), so every field RQ reads (``rq info``, ``Job.fetch``, rq-dashboard) is RQ's own."""
    queue = offline_queue(queue_name)
    job = queue.create_job(func, job_id="template", **options)
    job.origin = queue.name
    fields = job.to_dict()
    fields["status"] = "queued"
    for name in ("created_at", "enqueued_at", *drop):
        fields.pop(name, None)
    return fields


@lru_cache(maxsize=8)
@functools.lru_cache(maxsize=8)
def delivery_template(ttl_s: int, timeout_s: float) -> dict[str, Any]:
    """The hash of a first delivery job, as RQ's enqueue writes it, for the scripts to copy: the scripts'
    ``@delivery`` argument {ttl, prefix (of the delivery's id), fields}.

    The scripts add the id, the timestamps and the description. The job's call carries no arguments:
    ``deliver`` reads its job from the delivery's id. (Cached: the same for every call; never changed.)
    """
    fields = queued_job_fields(
        keys.WEBHOOK_QUEUE, DELIVER_FUNC, drop=("description",), **delivery_options(ttl_s, timeout_s)
    )
    return {"ttl": ttl_s, "prefix": DELIVERY_PREFIX, "fields": MappingProxyType(fields)}
