"""Every Redis key, channel and queue name inferq writes, in one place.

RQ's own ``rq:*`` keys are reached through RQ's API; the keys below are inferq's, and each
is written with a TTL.
"""

from __future__ import annotations

import hashlib
import re

PREFIX = "inferq"
# The pub/sub channel that carries one JSON event per job status change: {"id", "model", "status"}.
EVENTS_CHANNEL = f"{PREFIX}:events"
WEBHOOK_QUEUE = f"{PREFIX}.webhooks"

JOB_ID_RE = re.compile(r"^[A-Za-z0-9_-]{1,128}$")
MODEL_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9_-]{0,62}$")


def served_name(model: str, version: int) -> str:
    """What one version of a model is served as (shared/models.py): its queues, its workers' ``--model``, its
    metrics' key and its jobs' ``model`` field: the model's name for version 1, ``<model>@<version>`` past it."""
    return model if version == 1 else f"{model}@{version}"


def split_served(served: str) -> tuple[str, int]:
    """(model, version) of a served name."""
    model, _, version = served.partition("@")
    return model, int(version) if version.isascii() and version.isdigit() else 1


def served_label(served: str) -> str:
    """A served name as a log line names it, its version always said: ``digits v1``, ``digits v2``. The bare model
    name is version 1's served name, which misleads once version 2 serves the model ("digits removed")."""
    model, version = split_served(served)
    return f"{model} v{version}"


# Every model has two queues, its lanes: interactive work goes first, bulk work fills in.
INTERACTIVE, BULK = "interactive", "bulk"
LANES = (INTERACTIVE, BULK)


def queue_name(model: str, lane: str = INTERACTIVE) -> str:
    """The RQ queue a model's jobs of one lane wait in: ``inferq.<model>``, ``inferq.<model>.bulk``."""
    return f"{PREFIX}.{model}" if lane == INTERACTIVE else f"{PREFIX}.{model}.{lane}"


def model_from_queue(name: str) -> str:
    """The model a queue belongs to (model names have no dots)."""
    return name.removeprefix(f"{PREFIX}.").split(".", 1)[0]


def lane_of(name: str) -> str:
    """The lane a queue is."""
    rest = name.removeprefix(f"{PREFIX}.")
    return rest.split(".", 1)[1] if "." in rest else INTERACTIVE


def payload_key(job_id: str) -> str:
    """The job's input bytes; deleted when the job ends, expires with the queue TTL."""
    return f"{PREFIX}:payload:{job_id}"


def info_key(job_id: str) -> str:
    """A hash of inferq's own per-job facts (model, webhook, batch size, timings)."""
    return f"{PREFIX}:job:{job_id}"


def version_state_key(served: str) -> str:
    """A model version's last state as its workers told it (shared/versions.py): loading, warming, ready or failed."""
    return f"{PREFIX}:version:{served}"


def outcomes_key(served: str) -> str:
    """A version's last jobs' outcomes ("1" failed, "0" not), newest first, as long as its rollback window."""
    return f"{PREFIX}:outcomes:{served}"


def rollback_key(served: str) -> str:
    """A version the system rolled back: why, when, and the weights it judged (shared/versions.py)."""
    return f"{PREFIX}:rollback:{served}"


def rollout_key(model: str) -> str:
    """A model's traffic and ramp as set through the API (PUT /v1/models/{m}/rollout): over its config.json's."""
    return f"{PREFIX}:rollout:{model}"


# A rollout set through the API lasts this long after an API process last read it (each reads it every second or
# so while it serves the model, and renews it): it outlives restarts, and is gone a month after the last API.
ROLLOUT_TTL_S = 30 * 86_400

# A rollback stands this long unless restored (POST /v1/models/{m}/versions/{v}/restore) or new weights load.
ROLLBACK_TTL_S = 7 * 86_400

# How long a version's told state is kept: a failed load stays visible this long after the last try.
VERSION_STATE_TTL_S = 86_400


def withdrawn_key(job_id: str) -> str:
    """A submit whose answer never came back in time, withdrawn (lua/withdraw.lua): its enqueue, should it reach
    Redis late, stores nothing. Lives ``WITHDRAWN_TTL_S``."""
    return f"{PREFIX}:withdrawn:{job_id}"


# Longer than any submit can wait in a socket or behind a stalled Redis before it runs.
WITHDRAWN_TTL_S = 3600


def attempt_key(job_id: str) -> str:
    """Tracing on: the span of the job's attempt now running, and when it began (shared/tracing.py), so a retry
    links to it. It lives no longer than the started job's own hash, and goes with the job's end (the scripts that
    end a job; the finish keeps its value in the info hash, ``F.ENDED_IN``)."""
    return f"{PREFIX}:attempt:{job_id}"


def webhook_attempts_key(job_id: str) -> str:
    """A list of JSON delivery attempts for the job's webhook."""
    return f"{PREFIX}:webhook:{job_id}"


def idempotency_key(owner: str, key: str) -> str:
    """The job an Idempotency-Key created, per API key owner: "<job id> <body fingerprint>"."""
    digest = hashlib.sha256(f"{owner}\0{key}".encode()).hexdigest()
    return f"{PREFIX}:idem:{digest}"


def tenant_rate_key(tenant: str) -> str:
    """A tenant's jobs-per-minute quota as the generic cell rate algorithm holds it (its theoretical arrival time,
    in ms); it expires when the tenant is back to a full burst."""
    return f"{PREFIX}:tenant:{tenant}:rate"


# A bulk batch's items travel in chunks, each an RQ job "batch-<batch id>-<n>" in the model's lane;
# single job ids never start with this prefix (``shared.jobs.new_job_id``).
CHUNK_PREFIX = "batch-"


def batch_key(batch_id: str) -> str:
    """A hash of one bulk batch: its model, options and item counts."""
    return f"{PREFIX}:batch:{batch_id}"


def batch_results_key(batch_id: str) -> str:
    """A list of the batch's result lines (JSON), in the order items ended."""
    return f"{PREFIX}:batch:{batch_id}:results"


def batch_chunks_key(batch_id: str) -> str:
    """A list of the batch's chunk job ids."""
    return f"{PREFIX}:batch:{batch_id}:chunks"


def batch_ids_key(batch_id: str) -> str:
    """A hash of the custom ids an upload took so far, each to the line that first held it; gone once queued."""
    return f"{PREFIX}:batch:{batch_id}:ids"


def tenant_in_flight_key(tenant: str) -> str:
    """A tenant's jobs not yet ended, while it has an in-flight quota: a sorted set of ids scored by when each has
    surely ended (ms); it expires with the last of them."""
    return f"{PREFIX}:tenant:{tenant}:in-flight"


def tenant_bulk_lines_key(tenant: str) -> str:
    """A tenant's uploads and their lines still waiting, as last counted, while it has a bulk_lines quota: a hash of
    batch id -> lines; it expires with the last of its batches' records."""
    return f"{PREFIX}:tenant:{tenant}:bulk-lines"


def fair_tags_key(queue_name: str) -> str:
    """The virtual start tags of a queue's jobs in its RQ list, while several tenants share it (lua/lib/fair.lua); it
    expires with a queued job's TTL and is dropped whenever the queue empties."""
    return f"{PREFIX}:fair:{queue_name}:tags"


def fair_state_key(queue_name: str) -> str:
    """A queue's tenants' last virtual finish tags (lua/lib/fair.lua), with the same life as ``fair_tags_key``."""
    return f"{PREFIX}:fair:{queue_name}:state"


def fair_backlog_key(queue_name: str) -> str:
    """A queue's jobs in fair order past its RQ list's first ``layout.FAIR_WINDOW`` (lua/lib/fair.lua): a sorted set
    of job id -> virtual start tag, moved into the list as it is claimed; with the same life as ``fair_tags_key``."""
    return f"{PREFIX}:fair:{queue_name}:backlog"


def waiting_items_key(queue_name: str) -> str:
    """The number of bulk batch items waiting in an RQ queue (their chunks queued, not yet started)."""
    return f"{PREFIX}:waiting-items:{queue_name}"


def chunk_id(batch_id: str, number: int) -> str:
    return f"{CHUNK_PREFIX}{batch_id}-{number}"


def is_chunk(job_id: str) -> bool:
    return job_id.startswith(CHUNK_PREFIX)


def batch_of_chunk(job_id: str) -> str:
    return job_id.removeprefix(CHUNK_PREFIX).rsplit("-", 1)[0]


# A job's first webhook delivery is the RQ job "webhook-<job id>" (shared/lifecycle/layout.py): queued only once.
DELIVERY_PREFIX = "webhook-"


def is_client_job(job_id: str) -> bool:
    """Whether ``job_id`` may name a client's job: every job route reads and cancels only these."""
    # A chunk or a webhook delivery is an RQ job with a predictable id but no client's job: a chunk canceled alone
    # ended its items unseen by its batch, which then never ended; a delivery canceled was a webhook never sent.
    return JOB_ID_RE.match(job_id) is not None and not is_chunk(job_id) and not job_id.startswith(DELIVERY_PREFIX)


# Metrics (shared/metrics.py): counters and histogram buckets that workers and API processes add to,
# read by every API process's GET /metrics and GET /v1/status. Each is refreshed with a TTL on write.
def metrics_key(model: str) -> str:
    """A hash of one model's counters and histogram buckets since the key was (re)created."""
    return f"{PREFIX}:metrics:model:{model}"


def metrics_window_key(model: str, start: int) -> str:
    """The same hash for one short window starting at ``start`` (epoch seconds): the status page's charts."""
    return f"{PREFIX}:metrics:model:{model}:w:{start}"


def metrics_failures_key(model: str) -> str:
    """A short list of the model's latest failures (JSON: time, reason class, readable error), newest first."""
    return f"{PREFIX}:metrics:model:{model}:failures"


# INFERQ_DURABILITY: a write of our own before WAIT, so that WAIT confirms every write made before it
# (shared/durability.py).
DURABILITY_PROBE_KEY = f"{PREFIX}:durability:probe"
DURABILITY_PROBE_TTL_S = 60


# Webhook deliveries' counters and latency histogram, for every job and batch.
WEBHOOK_METRICS_KEY = f"{PREFIX}:metrics:webhooks"
# API requests by route, method and status, summed over every API process.
HTTP_METRICS_KEY = f"{PREFIX}:metrics:http"
