"""Traces across the queue, as a collector sees them: a real `inferq up` exporting over OTLP to a receiver that
decodes the real protobuf. One trace per job (submit → queue → attempt), one span per batch linked from every job it
served, a caller's `traceparent` continued, the webhook's receiver given the job's, a killed attempt linked from
its retry."""

from __future__ import annotations

import json
import os
import secrets
import signal
import socket
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support import otlp
from tests.support.models import make_models_dir
from tests.support.stack import new_stack, serving
from tests.support.up import up_serving
from tests.support.waiting import wait_until
from tests.support.webhooks import Receiver

SERVER, PRODUCER, CONSUMER, CLIENT = 2, 4, 5, 3
ERROR = 2


@pytest.fixture
def collector() -> Iterator[otlp.Receiver]:
    yield from otlp.http_receiver()


def _tracing(collector: otlp.Receiver) -> dict[str, str]:
    # Exported every 100 ms, not every 5 s: the test reads them soon after the jobs end.
    return {"OTEL_EXPORTER_OTLP_ENDPOINT": collector.endpoint, "OTEL_BSP_SCHEDULE_DELAY": "100"}


def _views(base: str, ids: list[str]) -> list[dict[str, Any]]:
    with httpx.Client(timeout=10) as client:
        return [client.get(f"{base}/v1/jobs/{i}").json() for i in ids]


def test_up_exports_one_trace_per_job_with_its_batch_linked_and_the_callers_trace_continued(
    tmp_path: Path, collector: otlp.Receiver
) -> None:
    hooks = Receiver()  # fails each first delivery with a 500: two attempts
    caller_trace, caller_span = secrets.token_hex(16), secrets.token_hex(8)
    settings = {
        "INFERQ_MODELS_DIR": str(make_models_dir(tmp_path / "models")),
        "INFERQ_TEST_SLOW_S": "0.3",
        "INFERQ_WEBHOOK_ALLOW": "127.0.0.1",
        "INFERQ_WEBHOOK_RETRY_DELAYS_S": "[0.2]",
        **_tracing(collector),
    }
    try:
        with up_serving(tmp_path, 120, **settings) as (_, base, _):
            url = f"{base}/v1/models/slow/jobs"
            first = httpx.post(
                url,
                json={"inputs": [0, 0], "webhook": hooks.url},
                headers={"traceparent": f"00-{caller_trace}-{caller_span}-01", "tracestate": "caller=1"},
                timeout=10,
            )
            assert first.status_code == 202, first.text
            ids = [first.json()["id"]]
            ids += [httpx.post(url, json={"inputs": [n, n]}, timeout=10).json()["id"] for n in range(1, 12)]
            wait_until(lambda: {v["status"] for v in _views(base, ids)} == {"finished"}, 60, "every job to finish")
            views = _views(base, ids)
            wait_until(lambda: len(hooks.deliveries) == 2, 30, "the webhook's two attempts")
            # The batches the job views imply: one per worker and start time.
            batches = Counter((v["worker"], v["started_at"]) for v in views)
            assert sum(batches.values()) == 12

            def spans() -> list[otlp.Span]:
                return collector.spans()

            def done() -> bool:
                names = Counter(s.name for s in spans())
                return (
                    names["send slow"] == 12
                    and names["process inferq.slow"] == 12
                    and names["batch slow"] == len(batches)
                    and names["webhook"] == 2
                )

            wait_until(done, 30, "every span to be exported")
    finally:
        hooks.close()
    received = collector.spans()
    by_id = {s.span_id: s for s in received}
    submits = {s.attributes["messaging.message.id"]: s for s in received if s.name == "send slow"}
    assert set(submits) == set(ids)
    # One trace per job.
    assert len({s.trace_id for s in submits.values()}) == 12
    # The caller's trace continues: the first job's request span (FastAPI's server span) is its child, and the
    # submit span the request span's.
    first_submit = submits[ids[0]]
    request = by_id[first_submit.parent_id]
    assert (request.trace_id, request.parent_id, request.kind) == (caller_trace, caller_span, SERVER)
    assert request.attributes["http.route"] == "/v1/models/slow/jobs"
    assert first_submit.kind == PRODUCER and first_submit.service == "inferq-api"
    assert first_submit.trace_id == caller_trace
    # Only the requests are traced (the submits and the test's polls), not FastAPI's steps inside them, nor probes.
    traced = {s.name for s in received if s.service == "inferq-api"}
    assert traced == {"send slow", "POST /v1/models/slow/jobs", "GET /v1/jobs/{job_id}"}
    batch_spans = {s.span_id: s for s in received if s.name == "batch slow"}
    assert len(batch_spans) == len(batches)
    linked: Counter[str] = Counter()
    for submit in submits.values():
        in_trace = [s for s in received if s.trace_id == submit.trace_id]
        queue = [s for s in in_trace if s.name == "queue inferq.slow"]
        attempts = [s for s in in_trace if s.name == "process inferq.slow"]
        assert len(queue) == 1 and len(attempts) == 1, [s.name for s in in_trace]
        assert queue[0].parent_id == submit.span_id and attempts[0].parent_id == submit.span_id
        assert queue[0].end_ns <= attempts[0].start_ns + 1_000_000
        attempt = attempts[0]
        assert attempt.kind == CONSUMER and attempt.service == "inferq-worker"
        # Linked to exactly one batch span, the batch it ran in.
        assert len(attempt.links) == 1 and attempt.links[0][1] in batch_spans, attempt.links
        batch = batch_spans[attempt.links[0][1]]
        assert (submit.trace_id, submit.span_id) in batch.links  # and the batch links back to each job it served
        linked[batch.span_id] += 1
    # Each batch span's size is the number of jobs that link to it, and it has its phases as children.
    for span_id, batch in batch_spans.items():
        assert batch.attributes["inferq.batch.size"] == linked[span_id]
        assert batch.attributes["inferq.model"] == "slow" and batch.attributes["inferq.device"] == "cpu"
        phases = {s.name for s in received if s.parent_id == span_id}
        assert phases == {"preprocess", "collate", "predict", "uncollate", "postprocess", "finish"}, phases
    assert sorted(batch.attributes["inferq.batch.size"] for batch in batch_spans.values()) == sorted(batches.values())
    # The webhook's receiver joins the job's trace: each attempt sent its own span's traceparent.
    sent = [d["headers"]["traceparent"] for d in hooks.deliveries]
    webhooks = {s.span_id: s for s in received if s.name == "webhook"}
    assert [header.split("-")[1] for header in sent] == [caller_trace, caller_trace]
    assert {header.split("-")[2] for header in sent} == set(webhooks)
    outcomes = sorted((s.attributes["inferq.webhook.outcome"], s.status) for s in webhooks.values())
    assert outcomes == [("delivered", 0), ("retrying", ERROR)]
    first_attempt = next(s for s in received if s.name == "process inferq.slow" and s.trace_id == caller_trace)
    assert {s.parent_id for s in webhooks.values()} == {first_attempt.span_id}
    assert all(s.kind == CLIENT and s.service == "inferq-webhooks" for s in webhooks.values())
    assert by_id[first_attempt.parent_id] == first_submit
    # The whole trace, drawn as the README shows one (names and nesting; the durations vary).
    drawn = [line[:40].rstrip() for line in otlp.tree(received, caller_trace).splitlines()]
    assert drawn == [
        "POST /v1/models/slow/jobs",
        "└─ send slow",
        "   ├─ queue inferq.slow",
        "   └─ process inferq.slow",
        "      ├─ webhook",
        "      ├─ webhook",
        "      └─ ↪ batch slow",
        "         ├─ preprocess",
        "         ├─ collate",
        "         ├─ predict",
        "         ├─ uncollate",
        "         ├─ postprocess",
        "         └─ finish",
    ], otlp.tree(received, caller_trace)


def test_a_failed_job_sets_its_attempts_status_with_the_reason_its_view_shows(
    tmp_path: Path, collector: otlp.Receiver
) -> None:
    stack = new_stack(tmp_path, **_tracing(collector))
    with serving(stack):
        stack.start_api()
        stack.start_worker("slow")
        url = f"{stack.base}/v1/models/slow/jobs"
        bad = httpx.post(url, json={"inputs": [666, 666]}, timeout=10).json()["id"]  # the model's poison value
        wait_until(lambda: _views(stack.base, [bad])[0]["status"] == "failed", 60, "the poisoned job to fail")
        error = _views(stack.base, [bad])[0]["error"]

        def attempt() -> list[otlp.Span]:
            return [s for s in collector.spans() if s.attributes.get("messaging.message.id") == bad]

        wait_until(lambda: any(s.name == "process inferq.slow" for s in attempt()), 30, "the attempt's span")
        logs = stack.log_text()
    span = next(s for s in attempt() if s.name == "process inferq.slow")
    assert (span.status, span.status_message) == (ERROR, error)
    # The worker's log line about it carries the ids of the batch it ran in.
    ((_, batch_id),) = span.links
    batch = next(s for s in collector.spans() if s.span_id == batch_id)
    line = next(line for line in logs.splitlines() if f"model failed on job {bad}" in line)
    assert line.endswith(f" trace={batch.trace_id} span={batch.span_id}"), line


def test_a_worker_killed_mid_batch_leaves_both_attempts_in_the_trace_linked(
    tmp_path: Path, collector: otlp.Receiver
) -> None:
    stack = new_stack(tmp_path, **_tracing(collector))
    with serving(stack):
        stack.start_api()
        url = f"{stack.base}/v1/models/slow/jobs"
        ids = [httpx.post(url, json={"inputs": [n, n]}, timeout=10).json()["id"] for n in range(3)]
        doomed = stack.start_worker("slow", name="doomed", env={"INFERQ_TEST_SLOW_S": "30"})
        wait_until(lambda: "started" in {v["status"] for v in _views(stack.base, ids)}, 60, "the batch to start")
        doomed.kill()
        doomed.wait()
        stack.start_worker("slow", name="after", env={"INFERQ_TEST_SLOW_S": "0"})
        wait_until(lambda: {v["status"] for v in _views(stack.base, ids)} == {"finished"}, 180, "the retried jobs")

        def attempts(job_id: str) -> list[otlp.Span]:
            spans = collector.spans()
            return [
                s for s in spans if s.name == "process inferq.slow" and s.attributes["messaging.message.id"] == job_id
            ]

        wait_until(lambda: all(len(attempts(i)) == 2 for i in ids), 30, "both attempts of every job")
        # Each attempt's record went with its job's end (the lost one's was read by the retry).
        assert list(stack.redis().scan_iter("inferq:attempt:*")) == []
    for job_id in ids:
        lost, retried = sorted(attempts(job_id), key=lambda s: s.start_ns)
        assert lost.attributes.get("inferq.attempt.lost") is True and lost.status == ERROR
        assert lost.trace_id == retried.trace_id and lost.parent_id == retried.parent_id
        assert (lost.trace_id, lost.span_id) in retried.links  # the retry links to the attempt it replaces


def test_a_bulk_line_with_a_traceparent_continues_its_callers_trace_linked_to_its_batch(
    tmp_path: Path, collector: otlp.Receiver
) -> None:
    callers = {f"line-{n}": (secrets.token_hex(16), secrets.token_hex(8)) for n in range(4)}
    lines: list[dict[str, Any]] = [
        {"custom_id": custom_id, "inputs": [666 if n == 3 else n, n], "traceparent": f"00-{t}-{s}-01"}
        for n, (custom_id, (t, s)) in enumerate(callers.items())
    ]
    lines += [{"custom_id": f"plain-{n}", "inputs": [n, n]} for n in range(2)]
    lines.append({"custom_id": "bad-trace", "inputs": [1, 1], "traceparent": "00-abc-def-01"})
    body = b"".join(json.dumps(line).encode() + b"\n" for line in lines)
    stack = new_stack(tmp_path, **_tracing(collector))
    with serving(stack):
        stack.start_api()
        stack.start_worker("slow")
        answer = httpx.post(
            f"{stack.base}/v1/models/slow/batches",
            content=body,
            headers={"content-type": "application/jsonl"},
            timeout=30,
        ).json()
        # A malformed traceparent is refused by name, the line alone.
        ((refused),) = answer["refused"]
        assert refused["custom_id"] == "bad-trace"
        assert refused["error"].startswith("line 7: traceparent must be a W3C trace context: 00-<32 hex trace id>")

        def ended() -> bool:
            return httpx.get(f"{stack.base}/v1/batches/{answer['id']}", timeout=10).json()["status"] == "finished"

        wait_until(ended, 60, "the upload to end")
        results = httpx.get(f"{stack.base}/v1/batches/{answer['id']}/results", timeout=10).text.splitlines()
        errors = {line["custom_id"]: line.get("error") for line in map(json.loads, results)}

        def line_spans() -> list[otlp.Span]:
            return [s for s in collector.spans() if "inferq.custom_id" in s.attributes]

        wait_until(lambda: len(line_spans()) == 8, 30, "each traced line's queue and attempt spans")
    received = collector.spans()
    batch_spans = {s.span_id: s for s in received if s.name == "batch slow"}
    assert len(line_spans()) == 8  # the untraced lines have none of their own
    for custom_id, (trace_id, span_id) in callers.items():
        mine = [s for s in line_spans() if s.attributes["inferq.custom_id"] == custom_id]
        assert sorted(s.name for s in mine) == ["process inferq.slow.bulk", "queue inferq.slow.bulk"]  # its lane
        assert all((s.trace_id, s.parent_id) == (trace_id, span_id) for s in mine)
        attempt = next(s for s in mine if s.name == "process inferq.slow.bulk")
        assert attempt.attributes["inferq.batch.id"] == answer["id"]
        assert len(attempt.links) == 1 and attempt.links[0][1] in batch_spans
        assert (trace_id, span_id) in batch_spans[attempt.links[0][1]].links
        if errors[custom_id] is None:
            assert attempt.status == 0
        else:  # the poisoned line: its span says why, as its result line does
            assert (attempt.status, attempt.status_message) == (ERROR, errors[custom_id])


def test_a_log_line_the_api_writes_while_a_submit_fails_carries_its_trace_and_span(
    tmp_path: Path, collector: otlp.Receiver
) -> None:
    caller_trace, caller_span = secrets.token_hex(16), secrets.token_hex(8)
    stack = new_stack(tmp_path, **_tracing(collector))
    with serving(stack):
        stack.start_api()
        redis = stack.redis()
        redis.config_set("maxmemory", "1")  # every write that may grow memory is refused: the submit fails
        try:
            answer = httpx.post(
                f"{stack.base}/v1/models/slow/jobs",
                json={"inputs": [1, 1]},
                headers={"traceparent": f"00-{caller_trace}-{caller_span}-01"},
                timeout=10,
            )
        finally:
            redis.config_set("maxmemory", "0")
        assert answer.status_code == 503, answer.text

        def submits() -> list[otlp.Span]:
            return [s for s in collector.spans() if s.name == "send slow"]

        wait_until(lambda: len(submits()) == 1, 30, "the submit's span")
        logs = stack.log_text()
    (submit,) = submits()
    assert (submit.trace_id, submit.status) == (caller_trace, ERROR)
    line = next(line for line in logs.splitlines() if "Redis unavailable" in line)
    assert line.endswith(f" trace={caller_trace} span={submit.span_id}"), line


def test_tracing_off_runs_no_span_processor_and_never_imports_the_sdk(tmp_path: Path) -> None:
    """Without an OTLP endpoint (or with OTEL_SDK_DISABLED=true) nothing of the SDK is loaded; with one, exactly one
    batch span processor runs."""
    import subprocess
    import sys

    probe = (
        "import sys; from inferq.shared import tracing; on = tracing.setup('api'); "
        "print(on, tracing.span_processors(), 'opentelemetry.sdk' in sys.modules)"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    cases = [
        ({}, "False 0 False"),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9", "OTEL_SDK_DISABLED": "true"}, "False 0 False"),
        ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://127.0.0.1:9/v1/traces"}, "True 1 True"),
    ]
    for extra, printed in cases:
        out = subprocess.run([sys.executable, "-c", probe], env=env | extra, capture_output=True, text=True)
        assert out.stdout.strip() == printed, (extra, out.stdout, out.stderr[-2000:])


@pytest.fixture(params=["refusing", "black-holed"])
def unreachable_collector(request: pytest.FixtureRequest) -> Iterator[str]:
    """A collector's address that cannot take a span: nothing listens there, or it takes connections and never
    answers (a frozen or black-holed collector)."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        if request.param == "black-holed":
            server.listen(64)  # connections complete in the backlog; none is ever accepted
        yield f"http://127.0.0.1:{server.getsockname()[1]}"


def test_a_worker_stops_at_once_when_the_collector_cannot_take_its_last_spans(
    tmp_path: Path, unreachable_collector: str
) -> None:
    """At exit the buffered spans get FLUSH_AT_EXIT_S; the SDK alone waited for its export thread 30 s (each export
    retried for OTEL_EXPORTER_OTLP_TIMEOUT, here two minutes, so the wait is the SDK's whole bound)."""
    tracing_env = {
        "OTEL_EXPORTER_OTLP_ENDPOINT": unreachable_collector,
        "OTEL_EXPORTER_OTLP_TIMEOUT": "120",
        "OTEL_BSP_SCHEDULE_DELAY": "600000",  # the batch's spans still buffered at the stop
    }
    with serving(new_stack(tmp_path, INFERQ_TEST_SLOW_S="0")) as stack:
        stack.start_api()
        worker = stack.start_worker("slow", env=tracing_env)
        stack.wait_for_worker("slow")
        done = httpx.post(
            f"{stack.base}/v1/models/slow/jobs", json={"inputs": [1, 2]}, headers={"Prefer": "wait=30"}, timeout=40
        )
        assert done.status_code == 200, done.text
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(timeout=20) == 0  # a generous bound: 2 s of flush against the SDK's 30
        log = stack.logs[stack.procs.index(worker)].read_text()
    dropped = [line for line in log.splitlines() if "did not take the last spans" in line]
    assert len(dropped) == 1, log
    assert dropped[0].endswith(
        "inferq.shared.tracing WARNING tracing: the OTLP collector did not take the last spans within 2 s; "
        "they are dropped"
    ), dropped
    assert "Traceback" not in log, log
