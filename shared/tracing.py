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

import atexit
import contextlib
import contextvars
import logging
import re
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from inferq.shared.errors import ConfigError, InvalidInput
from inferq.shared.settings import TraceSettings

log = logging.getLogger(__name__)

PROTOCOLS = ("http/protobuf", "grpc")
SYSTEM = "inferq"
# At exit the spans still buffered get this long to reach the collector; what it has not taken by then is dropped.
# The SDK's own exit waits for its export thread up to 30 s, each export retried for OTEL_EXPORTER_OTLP_TIMEOUT (10 s):
# with the collector down, black-holed, answering 503 or slow, a worker took 25-30 s to stop instead of 0.2 s.
FLUSH_AT_EXIT_S = 2.0

# The SDK's tracer once ``setup`` turned tracing on; None while it is off.
_tracer: Any = None
_provider: Any = None
_forced = threading.local()  # a span id the next span takes (``_IdGenerator``): a lost attempt's own
# The API's submit span while its request is handled: not attached as OpenTelemetry's current span (that costs a
# fifth of the span), but a log line written meanwhile, the error handler's too, carries its ids.
_submitting: contextvars.ContextVar[Any] = contextvars.ContextVar("inferq_submit_span", default=None)


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
    provider = TracerProvider(
        resource=Resource.create(attributes), id_generator=_id_generator(), shutdown_on_exit=False
    )
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    trace.set_tracer_provider(provider)
    _provider, _tracer = provider, provider.get_tracer("inferq")
    atexit.register(shutdown)  # in the SDK's stead: bounded
    _log_ids()
    log.info("tracing on: OTLP %s, service %s", chosen, provider.resource.attributes.get(SERVICE_NAME))
    return True


def shutdown(timeout_s: float = FLUSH_AT_EXIT_S) -> None:
    """Send what is buffered (a process about to exit), for at most ``timeout_s``: what the collector has not taken by
    then is dropped, said in one line."""
    if _provider is None:
        return
    flush = threading.Thread(target=_provider.shutdown, name="inferq-tracing-flush", daemon=True)
    flush.start()
    flush.join(timeout_s)
    if flush.is_alive():
        log.warning("tracing: the OTLP collector did not take the last spans within %g s; they are dropped", timeout_s)
        # The SDK's export thread is left to the exit (a daemon thread): what it would still say of them is said.
        logging.getLogger("opentelemetry").setLevel(logging.CRITICAL)


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

        submitting = _submitting.get()  # more precise than the request's server span, current meanwhile
        span = submitting if submitting is not None else trace.get_current_span()
        context = span.get_span_context()
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


# FastAPI's own request spans (FastAPI ≥ 0.142 makes one per request once a tracer provider is set): the server
# span, a submit's parent, is kept; the dependency, endpoint and serialization spans under it are not (each costs
# as much as the submit span, and says little), nor are probes and scrapes.
_UNTRACED_PATHS = frozenset({"/", "/healthz", "/readyz", "/metrics", "/favicon.ico"})


def fastapi_telemetry() -> dict[str, Any]:
    """FastAPI's ``telemetry=`` settings: its server spans (tracing on) through inferq's provider, and nothing else."""
    return {
        "tracing": True,
        "operation_spans": False,
        "metrics": False,  # inferq's are Prometheus's, at /metrics
        "logs": False,  # inferq's log lines carry the ids instead
        "exclude": _untraced,
    }


def _untraced(scope: Mapping[str, Any]) -> bool:
    path = scope.get("path", "")
    return path in _UNTRACED_PATHS or path.startswith("/static/")


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


_TRACEPARENT = re.compile(r"(?!ff)[0-9a-f]{2}-(?!0{32})[0-9a-f]{32}-(?!0{16})[0-9a-f]{16}-[0-9a-f]{2}")
TRACESTATE_MAX = 512  # W3C: at most 32 members; a receiver may drop a longer one, this one refuses it


def given(traceparent: Any, tracestate: Any = None) -> dict[str, str] | None:
    """A trace context a body gives (a bulk line's ``traceparent`` and ``tracestate``), checked as W3C Trace
    Context defines them: None for none; a malformed one is refused by name, not dropped unseen, since a body's
    fields are the client's own and an unknown one is refused too."""
    if traceparent is None:
        if tracestate is not None:
            raise InvalidInput("tracestate needs a traceparent")
        return None
    if not isinstance(traceparent, str) or _TRACEPARENT.fullmatch(traceparent) is None:
        raise InvalidInput(
            "traceparent must be a W3C trace context: 00-<32 hex trace id>-<16 hex span id>-<2 hex flags>,"
            " lowercase, the ids not all zero"
        )
    context = {"traceparent": traceparent}
    if tracestate is not None:
        if not isinstance(tracestate, str) or len(tracestate) > TRACESTATE_MAX or not tracestate.isascii():
            raise InvalidInput(f"tracestate must be ASCII text of at most {TRACESTATE_MAX} characters")
        if tracestate:
            context["tracestate"] = tracestate
    return context


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
    """The submit span (kind producer, as the messaging conventions name a send), child of the request's server
    span (FastAPI's own, which continues the request's ``traceparent``), or of that ``traceparent`` where there is
    no server span, or else the root of a new trace; None while tracing is off. A submit that fails (a full
    queue, a quota) ends it with an error status."""
    if _tracer is None:
        yield None
        return
    from opentelemetry import trace
    from opentelemetry.trace import SpanKind, StatusCode

    attributes = {"messaging.system": SYSTEM, "messaging.operation.type": "send", "inferq.model": model}
    attributes["http.route"] = route
    # Under FastAPI's request span, the current context (context=None) is the parent; else the request's headers.
    served = trace.get_current_span().get_span_context().is_valid
    parent = None if served else parent_of(headers)
    span = _tracer.start_span(f"send {model}", context=parent, kind=SpanKind.PRODUCER, attributes=attributes)
    # Not made OpenTelemetry's current span (a fifth of the span's cost), only the one log lines name.
    token = _submitting.set(span)
    try:
        yield Submitted(span, carrier(span))
    except BaseException as exc:
        # Left set: the error handler that answers for it logs after this, in the same request's context.
        span.set_status(StatusCode.ERROR, f"{type(exc).__name__}: {exc}")
        raise
    else:
        _submitting.reset(token)
    finally:
        span.end()
