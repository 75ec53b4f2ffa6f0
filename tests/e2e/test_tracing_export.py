"""The export, as a collector receives it: a process with OTEL_EXPORTER_OTLP_ENDPOINT set sends its spans over OTLP,
with http/protobuf or grpc as OTEL_EXPORTER_OTLP_PROTOCOL says; the service name and the sampler are the standard
variables'."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator

import pytest

from inferq.client_http import trace_headers
from inferq.shared import tracing
from inferq.shared.errors import ConfigError
from tests.support import otlp
from tests.support.models import ROOT
from tests.support.waiting import wait_until

CALLER = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
# One submit span under the caller's context, sent before the process exits (the SDK flushes at exit).
PROBE = (
    "from inferq.shared import tracing; assert tracing.setup('api'); "
    f"cm = tracing.submit_span({{'traceparent': {CALLER!r}}}, 'digits', '/v1/models/{{model}}/jobs'); "
    "s = cm.__enter__(); s.queued('job-1', 'inferq.digits'); cm.__exit__(None, None, None)"
)


def _env(**otel: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    return env | {"PYTHONPATH": str(ROOT), **otel}


@pytest.fixture(params=["http/protobuf", "grpc"])
def receiver(request: pytest.FixtureRequest) -> Iterator[tuple[str, otlp.Receiver]]:
    make = otlp.http_receiver if request.param == "http/protobuf" else otlp.grpc_receiver
    for received in make():
        yield request.param, received


def test_a_process_exports_its_spans_over_the_protocol_named(receiver: tuple[str, otlp.Receiver]) -> None:
    protocol, received = receiver
    env = _env(OTEL_EXPORTER_OTLP_ENDPOINT=received.endpoint, OTEL_EXPORTER_OTLP_PROTOCOL=protocol)
    done = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    wait_until(lambda: len(received.spans()) == 1, 10, "the span")
    (span,) = received.spans()
    assert (span.name, span.service, span.kind) == ("send digits", "inferq-api", 4)
    assert (span.trace_id, span.parent_id) == ("0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331")
    assert span.attributes["messaging.message.id"] == "job-1"
    assert span.attributes["messaging.destination.name"] == "inferq.digits"


@pytest.fixture
def collector() -> Iterator[otlp.Receiver]:
    yield from otlp.http_receiver()


def test_the_service_name_and_a_callers_decision_not_to_sample_are_the_standard_variables(
    collector: otlp.Receiver,
) -> None:
    env = _env(OTEL_EXPORTER_OTLP_TRACES_ENDPOINT=f"{collector.endpoint}/v1/traces", OTEL_SERVICE_NAME="edge-api")
    unsampled = PROBE.replace(CALLER, CALLER[:-2] + "00")  # the caller chose not to sample this trace
    for probe in (unsampled, PROBE):
        done = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr[-2000:]
    wait_until(lambda: len(collector.spans()) >= 1, 10, "the sampled span")
    assert [span.service for span in collector.spans()] == ["edge-api"]  # only the sampled one


def test_the_switch_and_the_protocol_are_read_as_the_specification_says() -> None:
    assert not tracing.wanted({})
    assert tracing.wanted({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"})
    assert tracing.wanted({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://collector:4318/v1/traces"})
    assert not tracing.wanted({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_SDK_DISABLED": "TRUE"})
    assert tracing.protocol({}) == "http/protobuf"
    assert tracing.protocol({"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}) == "grpc"
    assert (
        tracing.protocol({"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf"})
        == "http/protobuf"
    )
    with pytest.raises(ConfigError, match="http/json"):
        tracing.protocol({"OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"})


def test_the_sdk_sends_the_traceparent_given_or_the_callers_current_context() -> None:
    assert trace_headers(CALLER) == {"traceparent": CALLER}
    assert trace_headers(None) == {}  # no current span in this process
    from opentelemetry import trace
    from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags

    context = SpanContext(0xABC, 0xDEF, is_remote=False, trace_flags=TraceFlags(1))
    with trace.use_span(NonRecordingSpan(context)):
        assert trace_headers(None) == {"traceparent": f"00-{0xABC:032x}-{0xDEF:016x}-01"}
