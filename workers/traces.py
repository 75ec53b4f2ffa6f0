"""A batch's spans, tracing on (shared/tracing.py): one span for the batch, its phases as children, and for each
job a queue span and an attempt span, children of the job's submit span, each attempt linked to the batch it ran
in (one batch serves many traces: span links, as the messaging conventions prescribe). A bulk item whose upload
line gave a ``traceparent`` gets the same two spans in that trace, linked to the batch too.

The batch span opens when the batch starts and is the current span while it runs, so every log line the batch
writes carries its ids; everything ends after the finish stored the results, on the finisher's thread.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any, cast

from redis import Redis

from inferq.shared import keys, tracing
from inferq.shared.lifecycle import claims
from inferq.shared.lifecycle.claims import Claimed
from inferq.shared.lifecycle.info import F
from inferq.shared.settings import Settings

if TYPE_CHECKING:  # names only: workers.running imports torch, and the webhook sender imports this module
    from inferq.workers.running import BatchReport, Item, ModelRunner

log = logging.getLogger(__name__)
LOST = "the worker running it stopped before the job ended; the job was run again"


class BatchTrace:
    """The spans of one batch; made only while tracing is on."""

    def __init__(
        self, connection: Redis, settings: Settings, runner: ModelRunner, items: list[Item], queue: str, worker: str
    ) -> None:
        from opentelemetry import context, trace
        from opentelemetry.trace import Link, SpanKind

        tracer = tracing._tracer
        config = runner.config
        self.jobs = list({item.job.id: item.job for item in items}.values())
        self.queue = queue
        started = tracing.ns(self.jobs[0].started_at)
        parents = [tracing.parent_of(job.info) for job in self.jobs]
        # Bulk items whose upload line gave a trace context: each gets its own spans in the line's trace.
        lines = [(item, tracing.parent_of(item.trace)) for item in items if item.trace]
        # The batch links to every submit it serves: each job's, and each traced line's.
        served: list[tuple[Any, dict[str, Any]]] = [
            (parent, {"messaging.message.id": job.id}) for job, parent in zip(self.jobs, parents, strict=True)
        ]
        served += [(parent, {"messaging.message.id": i.job.id, "inferq.custom_id": i.custom_id}) for i, parent in lines]
        links = []
        for parent, linked in served:
            submitted = tracing.span_context_in(parent)
            if submitted is not None:
                links.append(Link(submitted, linked))
        attributes = {
            "messaging.system": tracing.SYSTEM,
            "messaging.operation.type": "process",
            "messaging.destination.name": queue,
            "messaging.batch.message_count": len(self.jobs),
            "inferq.batch.size": len(items),
            "inferq.model": config.name,
            "inferq.version": config.version,
            "inferq.device": str(runner.device),
            "inferq.worker": worker,
        }
        self.span = tracer.start_span(
            f"batch {config.served}", kind=SpanKind.CONSUMER, links=links, start_time=started, attributes=attributes
        )
        batch = Link(self.span.get_span_context())

        def attempt(job: Claimed, parent: Any, waited: dict[str, Any], ran: dict[str, Any]) -> Any:
            """The job's (or line's) wait in the queue, over by now, and its attempt, open: linked to the batch."""
            if job.enqueued_at is not None:
                at = tracing.ns(job.enqueued_at)
                tracer.start_span(f"queue {queue}", context=parent, start_time=at, attributes=waited).end(
                    end_time=started
                )
            kind = SpanKind.CONSUMER
            return tracer.start_span(
                f"process {queue}", context=parent, kind=kind, links=[batch], start_time=started, attributes=ran
            )

        self.attempts: dict[str, Any] = {}
        # No longer than the started job's own hash: it goes with the job's end (the scripts that end a job).
        ttl_s = claims.running_job_ttl_s(settings)
        with connection.pipeline(transaction=False) as pipe:
            for job, parent in zip(self.jobs, parents, strict=True):
                job_id = {"messaging.message.id": job.id}
                span = attempt(job, parent, job_id, {**job_id, "inferq.batch.size": len(items)})
                self.attempts[job.id] = span
                stored = tracing.carrier(span)["traceparent"]
                pipe.set(keys.attempt_key(job.id), f"{stored} {started}", ex=ttl_s, get=True)
            previous = pipe.execute()
        # A line's attempt is not kept across a retry as a job's is: the chunk's own attempt span carries that.
        self.lines: list[tuple[Item, Any]] = []
        for item, parent in lines:
            line = {"messaging.message.id": item.job.id, "inferq.custom_id": str(item.custom_id)}
            line["inferq.batch.id"] = item.job.info.get(F.BATCH, "")
            self.lines.append((item, attempt(item.job, parent, line, line)))
        for job, parent, before in zip(self.jobs, parents, previous, strict=True):
            if before:
                self._lost(job, parent, before.decode() if isinstance(before, bytes) else before, started)
        self._token = context.attach(trace.set_span_in_context(self.span))

    def _lost(self, job: Claimed, parent: Any, stored: str, restarted: int) -> None:
        """The job ran before, in an attempt that never ended (its worker was killed or gave the batch back): that
        attempt's span, sent now with the id it began with, and this attempt linked to it."""
        from opentelemetry.trace import SpanKind, StatusCode

        traceparent, _, began = stored.partition(" ")
        context = tracing.span_context_of({"traceparent": traceparent})
        if context is None or not began.isdigit():
            return
        tracing._forced.span_id = context.span_id
        lost = tracing._tracer.start_span(
            f"process {self.queue}",
            context=parent,
            kind=SpanKind.CONSUMER,
            start_time=int(began),
            attributes={"messaging.message.id": job.id, "inferq.attempt.lost": True},
        )
        tracing._forced.span_id = None
        lost.set_status(StatusCode.ERROR, LOST)
        lost.end(end_time=restarted)
        self.attempts[job.id].add_link(context, {"inferq.attempt": "previous"})

    def leave(self) -> None:
        """The batch has run: its span is no longer the current one on the worker's thread."""
        from opentelemetry import context

        context.detach(self._token)

    def end(self, items: list[Item], report: BatchReport, finish: tuple[int, int]) -> None:
        """The batch's results are stored (``finish``: when that began and ended, epoch ns): its phases, the
        finish, each job's attempt and the batch itself end."""
        from opentelemetry import trace
        from opentelemetry.trace import StatusCode

        tracer = tracing._tracer
        inside = trace.set_span_in_context(self.span)
        for phase, began, ended in [*report.phases, ("finish", *finish)]:
            tracer.start_span(phase, context=inside, start_time=began).end(end_time=ended)
        ended = finish[1]  # a job's attempt ends once its result is stored, events sent, webhook queued
        failed: dict[str, list[str]] = {}
        counted: dict[str, int] = {}
        for item in items:
            counted[item.job.id] = counted.get(item.job.id, 0) + 1
            if item.error is not None:
                failed.setdefault(item.job.id, []).append(item.error)
        for job in self.jobs:
            span = self.attempts[job.id]
            errors = failed.get(job.id, [])
            if errors and counted[job.id] == len(errors):
                span.set_status(StatusCode.ERROR, errors[0])
            elif errors:
                span.set_attribute("inferq.items.failed", len(errors))
            span.end(end_time=ended)
        for item, span in self.lines:
            if item.error is not None:
                span.set_status(StatusCode.ERROR, item.error)
            span.end(end_time=ended)
        self.span.set_attribute("inferq.inference_ms", report.inference_ms)
        self.span.end(end_time=ended)


def begin(
    connection: Redis, settings: Settings, runner: ModelRunner, items: list[Item], queue: str, worker: str
) -> BatchTrace | None:
    """The batch's trace when tracing is on; a failure here never fails the batch."""
    if not tracing.on():
        return None
    started = time.perf_counter()
    try:
        return BatchTrace(connection, settings, runner, items, queue, worker)
    except Exception:
        log.exception("tracing: the batch's spans could not begin (%.1f ms)", (time.perf_counter() - started) * 1e3)
        return None


class WebhookSpan:
    """One delivery attempt's span (kind client), child of the attempt that ended the job; current while it
    runs, so the attempt's log lines carry its ids."""

    def __init__(self, span: Any) -> None:
        from opentelemetry import context, trace

        self.span = span
        self._token = context.attach(trace.set_span_in_context(span))

    def end(self, record: dict[str, Any]) -> None:
        from opentelemetry import context
        from opentelemetry.trace import StatusCode

        outcome = record.get("outcome", "failed")
        self.span.set_attribute("inferq.webhook.outcome", outcome)
        if record.get("status_code") is not None:
            self.span.set_attribute("http.response.status_code", record["status_code"])
        if outcome != "delivered":
            self.span.set_status(StatusCode.ERROR, str(record.get("error") or outcome))
        self.span.end()
        context.detach(self._token)


def webhook_span(connection: Redis, job_id: str, attempt: int) -> WebhookSpan | None:
    """The span of one attempt at a job's webhook, when tracing is on; its ``traceparent`` goes to the receiver."""
    if not tracing.on():
        return None
    from opentelemetry.trace import SpanKind

    try:
        fields = [F.ENDED_IN, F.TRACEPARENT, F.TRACESTATE]
        ran, traceparent, tracestate = cast(list[bytes | None], connection.hmget(keys.info_key(job_id), fields))
        if ran:  # the attempt that ended the job: "<traceparent> <start>"
            traceparent, tracestate = ran.split(b" ", 1)[0], None
        if not traceparent:
            return None
        carried = {"traceparent": traceparent.decode()}
        if tracestate:
            carried["tracestate"] = tracestate.decode()
        attributes = {"messaging.message.id": job_id, "inferq.webhook.attempt": attempt}
        span = tracing._tracer.start_span(
            "webhook", context=tracing.parent_of(carried), kind=SpanKind.CLIENT, attributes=attributes
        )
        return WebhookSpan(span)
    except Exception:
        log.exception("tracing: the webhook attempt's span could not begin")
        return None
