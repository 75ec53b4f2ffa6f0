"""A trace receiver speaking OTLP, as a collector would: over HTTP (``POST /v1/traces``, protobuf, maybe gzipped) or
gRPC, each request decoded with the OpenTelemetry proto package into plain span records."""

from __future__ import annotations

import gzip
import threading
from collections.abc import Iterator
from concurrent import futures
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.trace.v1 import trace_service_pb2
from opentelemetry.proto.common.v1.common_pb2 import AnyValue

from inferq.shared.redis_server import free_port


@dataclass(frozen=True)
class Span:
    """One received span."""

    trace_id: str
    span_id: str
    parent_id: str  # "" for a root span
    name: str
    kind: int  # the proto's: 1 internal, 2 server, 3 client, 4 producer, 5 consumer
    service: str
    attributes: dict[str, Any]
    links: tuple[tuple[str, str], ...]  # (trace id, span id)
    status: int  # 0 unset, 1 ok, 2 error
    status_message: str
    start_ns: int
    end_ns: int


def _value(value: AnyValue) -> Any:
    which = value.WhichOneof("value")
    return getattr(value, which) if which else None


def decode(body: bytes) -> list[Span]:
    """The spans of one ExportTraceServiceRequest."""
    request = trace_service_pb2.ExportTraceServiceRequest()
    request.ParseFromString(body)
    return spans_of(request)


def spans_of(request: Any) -> list[Span]:
    spans = []
    for resource_spans in request.resource_spans:
        resource = {a.key: _value(a.value) for a in resource_spans.resource.attributes}
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                spans.append(
                    Span(
                        trace_id=span.trace_id.hex(),
                        span_id=span.span_id.hex(),
                        parent_id=span.parent_span_id.hex(),
                        name=span.name,
                        kind=span.kind,
                        service=str(resource.get("service.name", "")),
                        attributes={a.key: _value(a.value) for a in span.attributes},
                        links=tuple((link.trace_id.hex(), link.span_id.hex()) for link in span.links),
                        status=span.status.code,
                        status_message=span.status.message,
                        start_ns=span.start_time_unix_nano,
                        end_ns=span.end_time_unix_nano,
                    )
                )
    return spans


@dataclass
class Receiver:
    """Spans received so far (``spans()``), and the endpoint to export them to."""

    endpoint: str = ""
    requests: int = 0
    _spans: list[Span] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, spans: list[Span]) -> None:
        with self._lock:
            self._spans.extend(spans)
            self.requests += 1

    def spans(self) -> list[Span]:
        with self._lock:
            return list(self._spans)


def http_receiver() -> Iterator[Receiver]:
    """An OTLP/HTTP receiver on a free port, for as long as the generator is open (a pytest fixture's body)."""
    receiver = Receiver()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            if self.headers.get("Content-Encoding") == "gzip":
                body = gzip.decompress(body)
            if self.path != "/v1/traces" or self.headers.get("Content-Type") != "application/x-protobuf":
                self.send_response(404)
                self.end_headers()
                return
            receiver.add(decode(body))
            answer = trace_service_pb2.ExportTraceServiceResponse().SerializeToString()
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", free_port()), Handler)
    receiver.endpoint = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield receiver
    finally:
        server.shutdown()
        server.server_close()


def grpc_receiver() -> Iterator[Receiver]:
    """An OTLP/gRPC receiver (the TraceService of the proto package) on a free port."""
    import grpc
    from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc

    receiver = Receiver()

    class Service(trace_service_pb2_grpc.TraceServiceServicer):
        def Export(self, request: Any, context: Any) -> Any:  # noqa: N802 (the proto's name)
            receiver.add(spans_of(request))
            return trace_service_pb2.ExportTraceServiceResponse()

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(Service(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    receiver.endpoint = f"http://127.0.0.1:{port}"
    try:
        yield receiver
    finally:
        server.stop(grace=None)


def tree(spans: list[Span], trace_id: str) -> str:
    """One trace as text, as a tracing UI draws it: each span under its parent, with its service and duration; under
    a span that links to another trace's span (a job's attempt and its batch), that span (↪) and its children."""
    by_id = {span.span_id: span for span in spans}
    children: dict[str, list[Span]] = {}
    for span in sorted(spans, key=lambda s: s.start_ns):
        children.setdefault(span.parent_id, []).append(span)
    lines: list[str] = []

    def draw(span: Span, prefix: str, branch: str, inside_link: bool, mark: str = "") -> None:
        label = f"{prefix}{branch}{mark}{span.name}"
        took = (span.end_ns - span.start_ns) / 1e6
        error = "  ERROR" if span.status == 2 else ""
        lines.append(f"{label:<40} {span.service:<16} {took:7.1f} ms{error}")
        below = prefix + {"": "", "├─ ": "│  ", "└─ ": "   "}[branch]
        under = [(child, inside_link, "") for child in children.get(span.span_id, [])]
        if not inside_link:  # a linked span's own links (the batch's back to every job) are not followed
            under += [(by_id[s], True, "↪ ") for t, s in span.links if t != span.trace_id and s in by_id]
        for n, (child, linked, marked) in enumerate(under):
            draw(child, below, "└─ " if n == len(under) - 1 else "├─ ", linked, marked)

    roots = [s for s in spans if s.trace_id == trace_id and (not s.parent_id or s.parent_id not in by_id)]
    for root in sorted(roots, key=lambda s: s.start_ns):
        draw(root, "", "", False)
    return "\n".join(lines)
