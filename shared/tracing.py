"""OpenTelemetry traces across the queue: one trace per job, from the client's request through the batch it shared
to its webhook (docs/tracing.md).

On only when ``OTEL_EXPORTER_OTLP_ENDPOINT`` or ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` is set and
``OTEL_SDK_DISABLED`` is not ``true``; everything else is the standard SDK's own environment (``OTEL_SERVICE_NAME``,
``OTEL_TRACES_SAMPLER``, ``OTEL_EXPORTER_OTLP_HEADERS``, ``OTEL_BSP_*``…). Off, the SDK is never imported, no span
processor exists, and every helper here returns at its first line.

The job carries its trace in its info hash: ``F.TRACEPARENT`` (and ``F.TRACESTATE``) hold the submit span's W3C
context, so the queue, job and webhook spans are its children wherever they run, and a retry keeps it.
``keys.attempt_key`` holds the running attempt's span (its context and start time): a retry links its new attempt to it,
and, since a worker killed mid-batch never exported that span, sends it on the dead worker's behalf, ended when the
job was taken up again.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from inferq.shared.errors import ConfigError
from inferq.shared.settings import TraceSettings

log = logging.getLogger(__name__)

PROTOCOLS = ("http/protobuf", "grpc")
SYSTEM = "inferq"

# The SDK's tracer once ``setup`` turned tracing on; None while it is off.
_tracer: Any = None
_provider: Any = None
_forced = threading.local()  # a span id the next span takes (``_IdGenerator``): a lost attempt's own


def _settings(variables: Mapping[str, str] | None) -> TraceSettings:
    return TraceSettings() if variables is None else TraceSettings.of(variables)


def wanted(variables: Mapping[str, str] | None = None) -> bool:
    """Whether the environment (or these ``OTEL_*`` variables) asks for traces: an OTLP endpoint, and the SDK not
    disabled."""
    otel = _settings(variables)
    if otel.sdk_disabled.strip().lower() == "true":
        return False
    return bool(otel.exporter_otlp_endpoint or otel.exporter_otlp_traces_endpoint)


def on() -> bool:
    return _tracer is not None


def protocol(variables: Mapping[str, str] | None = None) -> str:
    """The OTLP protocol the environment names (the specification's default: http/protobuf)."""
    otel = _settings(variables)
    chosen = otel.exporter_otlp_traces_protocol or otel.exporter_otlp_protocol or PROTOCOLS[0]
    if chosen not in PROTOCOLS:
        raise ConfigError(
            f"OTEL_EXPORTER_OTLP_PROTOCOL={chosen!r}: inferq exports traces over {' or '.join(PROTOCOLS)}"
        )
    return chosen


def setup(component: str) -> bool:
    """Turn tracing on in this process when the environment asks for it: the SDK's tracer provider, a batch span
    processor and the OTLP exporter of the protocol asked for. The service name is ``inferq-<component>`` unless
    ``OTEL_SERVICE_NAME`` says otherwise. True when on."""
    global _tracer, _provider
    if _tracer is not None or not wanted():
        return _tracer is not None
    from opentelemetry import trace
    from opentelemetry.sdk.resources import SERVICE_NAME, Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    chosen = protocol()
    if chosen == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
    else:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter  # type: ignore[assignment]
    attributes = {"inferq.component": component}
    if not TraceSettings().service_name:
        attributes[SERVICE_NAME] = f"inferq-{component}"
    # The sampler is the SDK's from OTEL_TRACES_SAMPLER: by default parent-based, so a caller's decision holds.
    provider = TracerProvider(resource=Resource.create(attributes), id_generator=_id_generator())
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    trace.set_tracer_provider(provider)
    _provider, _tracer = provider, provider.get_tracer("inferq")
    _log_ids()
    log.info("tracing on: OTLP %s, service %s", chosen, provider.resource.attributes.get(SERVICE_NAME))
    return True


def shutdown() -> None:
    """Send what is buffered (a process about to exit)."""
    if _provider is not None:
        _provider.shutdown()


def span_processors() -> int:
    """How many span processors run in this process (none while tracing is off)."""
    if _provider is None:
        return 0
    return len(_provider._active_span_processor._span_processors)


def _id_generator() -> Any:
    from opentelemetry.sdk.trace.id_generator import RandomIdGenerator

    class _IdGenerator(RandomIdGenerator):
        """Random ids, but a lost attempt's span is sent with the span id its worker stored when it began."""

        def generate_span_id(self) -> int:
            forced = getattr(_forced, "span_id", None)
            if forced is not None:
                _forced.span_id = None
                return int(forced)
            return super().generate_span_id()

    return _IdGenerator()


class _TraceIds(logging.Filter):
    """Every log line carries the trace and span of the work it was written in (`` trace=… span=…``)."""

    def filter(self, record: logging.LogRecord) -> bool:
        from opentelemetry import trace

        context = trace.get_current_span().get_span_context()
        record.otel = f" trace={context.trace_id:032x} span={context.span_id:016x}" if context.is_valid else ""
        return True


def _log_ids() -> None:
    """Show trace and span ids on the root handlers' lines (each handler's format gains ``%(otel)s``)."""
    for handler in logging.getLogger().handlers:
        handler.addFilter(_TraceIds())
        formatter = handler.formatter
        if formatter is not None and "%(otel)s" not in (formatter._fmt or ""):
            formatter._fmt = (formatter._fmt or "%(message)s").replace("%(message)s", "%(message)s%(otel)s")
            formatter._style._fmt = formatter._fmt


# Contexts: what a job stores, and spans' parents and links made from it.


def carrier(span: Any) -> dict[str, str]:
    """A span's W3C context as headers (``traceparent`` and, when it has one, ``tracestate``): what the propagator
    writes, formatted here at a fraction of its cost (a job stores one per submit)."""
    context = span.get_span_context()
    headers = {"traceparent": f"00-{context.trace_id:032x}-{context.span_id:016x}-{int(context.trace_flags):02x}"}
    if context.trace_state:
        headers["tracestate"] = context.trace_state.to_header()
    return headers


def parent_of(headers: Mapping[str, str]) -> Any:
    """The OpenTelemetry context a ``traceparent`` (and ``tracestate``) names; an empty one for none or a bad one
    (never the current one: a job with no trace is not the batch's child)."""
    from opentelemetry.context import Context
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    if not headers.get("traceparent"):
        return Context()
    found = {name: headers[name] for name in ("traceparent", "tracestate") if headers.get(name)}
    return TraceContextTextMapPropagator().extract(found, context=Context())


def span_context_in(context: Any) -> Any:
    """The span context a context from ``parent_of`` holds, or None."""
    from opentelemetry import trace

    found = trace.get_current_span(context).get_span_context()
    return found if found.is_valid else None


def span_context_of(headers: Mapping[str, str]) -> Any:
    """The span context a ``traceparent`` names, or None."""
    return span_context_in(parent_of(headers))


def ns(at: datetime) -> int:
    """Nanoseconds since the epoch (RQ's naive datetimes are UTC)."""
    if at.tzinfo is None:
        at = at.replace(tzinfo=UTC)
    return int(at.timestamp() * 1e9)


# The API's submit span.


@dataclass
class Submitted:
    """A submit's span, open while the API enqueues: ``stored`` is what the job keeps of it."""

    span: Any
    stored: dict[str, str]

    def queued(self, job_id: str, queue: str) -> None:
        self.span.set_attributes({"messaging.message.id": job_id, "messaging.destination.name": queue})


@contextlib.contextmanager
def submit_span(headers: Mapping[str, str], model: str, route: str) -> Iterator[Submitted | None]:
    """The submit span (kind producer, as the messaging conventions name a send), child of the request's
    ``traceparent`` when it has one, else the root of a new trace; None while tracing is off. A submit that fails
    (a full queue, a quota) ends it with an error status."""
    if _tracer is None:
        yield None
        return
    from opentelemetry.trace import SpanKind, StatusCode

    attributes = {"messaging.system": SYSTEM, "messaging.operation.type": "send", "inferq.model": model}
    attributes["http.route"] = route
    # Not made the current span: nothing under it logs, and attaching it costs a fifth of the span.
    span = _tracer.start_span(
        f"send {model}", context=parent_of(headers), kind=SpanKind.PRODUCER, attributes=attributes
    )
    try:
        yield Submitted(span, carrier(span))
    except BaseException as exc:
        span.set_status(StatusCode.ERROR, f"{type(exc).__name__}: {exc}")
        raise
    finally:
        span.end()
