"""The SDK's flows (inferq.client_flows) driven with canned answers, no network: retries and Retry-After, the
long-poll fallback, event reconnects, results resumed at their offset; then both clients driving them over
httpx.MockTransport (the client's import closure: tests/e2e/test_client_imports.py)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator
from types import SimpleNamespace
from typing import Any

import httpx
import pytest

from inferq import client_flows as flows
from inferq.client import (
    APIError,
    AsyncClient,
    BatchResult,
    Client,
    InvalidInput,
    Job,
    JobFailed,
    NotFound,
    QueueFull,
    Retry,
    TransportError,
    Unavailable,
    WaitTimeout,
)
from inferq.client_flows import READ_LINE, Base, Emit, Open, Send, Sleep
from inferq.client_http import Call, events_timeout, results_call, wait_call

# Backoff far below any Retry-After used here, so a delay equals the Retry-After it honours.
PATIENT = Retry(attempts=4, backoff_s=0.01, max_delay_s=10)


class Clock:
    """The flows' time.monotonic: moved on only by the sleeps they ask for."""

    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    fake = Clock()
    monkeypatch.setattr(flows, "time", SimpleNamespace(monotonic=fake.monotonic))
    return fake


def _base(retry: Retry = PATIENT, max_wait_s: float = 60.0) -> Base:
    return Base("http://api", None, 30.0, retry, max_wait_s)


def drive(
    feed: Any, answers: list[Any], clock: Clock | None = None, asked: list[Any] | None = None
) -> tuple[list[Any], list[Any]]:
    """(what ``feed`` asked for, what it emitted), answering each request in turn: a transport error is raised in."""
    asked = [] if asked is None else asked
    emitted: list[Any] = []
    left = list(answers)
    outcome: Any = None
    error: httpx.TransportError | None = None
    while (effect := flows.advance(feed, outcome, error)) is not None:
        outcome, error = None, None
        if isinstance(effect, Emit):
            emitted.append(effect.item)
            continue
        asked.append(effect)
        if isinstance(effect, Sleep):
            if clock is not None:
                clock.now += effect.seconds
            continue
        answer = left.pop(0)
        if isinstance(answer, httpx.TransportError):
            error = answer
        else:
            outcome = answer
    assert left == [], "answers left over"
    return asked, emitted


def run(flow: Any, answers: list[Any], clock: Clock | None = None) -> tuple[list[Any], Any]:
    """(what ``flow`` asked for, its value)."""
    asked, (value,) = drive(flows.returning(flow), answers, clock)
    return asked, value


def _status(
    status_code: int, retry_after: str | None = None, code: str = "http_error", message: str = "no"
) -> httpx.Response:
    headers = {"Retry-After": retry_after} if retry_after else {}
    return httpx.Response(status_code, headers=headers, json={"error": {"code": code, "message": message}})


def _job(status: str, job_id: str = "j1", **fields: Any) -> dict[str, Any]:
    return {"id": job_id, "model": "m", "status": status, **fields}


def _ok(data: Any) -> httpx.Response:
    return httpx.Response(200, json=data)


# Retries: one request.


@pytest.mark.parametrize(("code", "error"), [(503, Unavailable), (429, QueueFull)])
def test_a_503_or_429_is_retried_no_sooner_than_retry_after(code: int, error: type[APIError]) -> None:
    call = Call("GET", "/v1/models")
    asked, response = run(flows.send(_base(), call), [_status(code, "2"), _status(code, "3"), _ok({"models": []})])
    assert asked == [Send(call), Sleep(2.0), Send(call), Sleep(3.0), Send(call)]
    assert response.json() == {"models": []}
    with pytest.raises(error) as given_up:
        run(flows.send(_base(), call), [_status(code, "1")] * 4)
    assert given_up.value.retry_after_s == 1.0 and given_up.value.status == code


def test_a_retry_after_past_the_cap_and_other_errors_reach_the_caller_at_once() -> None:
    call = Call("GET", "/v1/models")
    for answer, error in ((_status(429, "11"), QueueFull), (_status(500), APIError), (_status(404), NotFound)):
        asked: list[Any] = []
        with pytest.raises(error):
            drive(flows.returning(flows.send(_base(), call)), [answer, _ok({})], asked=asked)
        assert asked == [Send(call)]


def test_transport_errors_are_retried_unless_a_request_that_is_not_repeatable_may_have_been_sent() -> None:
    cancel = Call("POST", "/v1/jobs/j1/cancel", repeatable=False)
    refused = httpx.ConnectError("refused")
    asked, response = run(flows.send(_base(), cancel), [refused, _ok(_job("canceled"))])
    assert [type(effect) for effect in asked] == [Send, Sleep, Send] and response.status_code == 200
    with pytest.raises(TransportError, match=r"POST http://api/v1/jobs/j1/cancel: ReadError"):
        run(flows.send(_base(), cancel), [httpx.ReadError("cut")])
    read = Call("GET", "/v1/jobs/j1")
    asked, _ = run(flows.send(_base(), read), [httpx.ReadError("cut"), _ok(_job("queued"))])
    assert [type(effect) for effect in asked] == [Send, Sleep, Send]
    with pytest.raises(TransportError):
        run(flows.send(_base(Retry(attempts=2, backoff_s=0.01)), read), [refused, refused])


# Waiting for a job.


def test_wait_long_polls_and_polls_instead_when_the_api_refuses_the_wait(clock: Clock) -> None:
    refused = _status(422, code="invalid_input", message="wait is above the API's cap")
    answers = [refused, _ok(_job("started")), _ok(_job("finished", result=7))]
    asked, job = run(flows.wait(_base(), "j1", 5), answers, clock)
    assert asked == [Send(wait_call("j1", 5)), Send(wait_call("j1", 0)), Sleep(0.5), Send(wait_call("j1", 0))]
    assert asked[0].call.params == {"wait": "5.000"} and asked[1].call.params is None
    assert (job.status, job.result) == ("finished", 7)


def test_wait_asks_for_what_is_left_and_times_out_with_the_jobs_last_view(clock: Clock) -> None:
    asked: list[Any] = []
    with pytest.raises(WaitTimeout) as late:
        drive(flows.returning(flows.wait(_base(max_wait_s=0.8), "j1", 1)), [_ok(_job("queued"))] * 3, clock, asked)
    assert late.value.job.status == "queued" and "after 1 s" in str(late.value)
    # Each long-poll asks for what is left (at most max_wait_s); one answered early is followed by a pause.
    assert asked == [
        Send(wait_call("j1", 0.8)),
        Sleep(0.5),
        Send(wait_call("j1", 0.5)),
        Sleep(0.5),
        Send(wait_call("j1", 0)),
    ]


def test_a_failed_job_raises_job_failed(clock: Clock) -> None:
    with pytest.raises(JobFailed) as failed:
        run(flows.wait(_base(), "j1", 5), [_ok(_job("failed", error="poison"))], clock)
    assert failed.value.job.error == "poison"


def test_run_resubmits_with_the_same_key_without_prefer_when_the_api_refuses_the_wait(clock: Clock) -> None:
    options = {"inputs": [1, 2], "file": None, "image": None, "webhook": None, "result_ttl": None}
    options |= {"ttl": None, "priority": None, "idempotency_key": None}
    refused = _status(400, code="invalid_input", message="Prefer: wait=90 is above the API's cap")
    answers = [refused, _ok(_job("queued")), _ok(_job("finished", result=3))]
    asked, job = run(flows.run(_base(max_wait_s=90), "m", options, 90), answers, clock)
    first, second, waited = asked[0].call, asked[1].call, asked[2].call
    assert first.headers["Prefer"] == "wait=90" and "Prefer" not in second.headers
    assert first.headers["Idempotency-Key"] == second.headers["Idempotency-Key"]
    assert first.json == second.json == {"inputs": [1, 2]}
    assert waited == wait_call("j1", 90) and len(asked) == 3 and job.result == 3
    # Held until the end by Prefer: wait, it asks nothing more; another refusal reaches the caller.
    asked, job = run(flows.run(_base(), "m", options, 5), [_ok(_job("finished", result=4))], clock)
    assert len(asked) == 1 and job.result == 4
    with pytest.raises(InvalidInput):
        run(flows.run(_base(), "m", options, 5), [_status(422, code="invalid_input", message="bad shape")], clock)


# Server-Sent Events.


def _sse(job: dict[str, Any]) -> list[str]:
    return [f"event: {job['status']}", f"data: {json.dumps(job)}", ""]


def test_events_reopen_a_cut_stream_and_yield_each_status_once() -> None:
    opened = httpx.Response(200)
    answers = [opened, *_sse(_job("queued")), httpx.ReadError("cut"), opened, *_sse(_job("queued"))]
    answers += [": keep-alive", "", *_sse(_job("started")), *_sse(_job("finished", result=1))]
    asked, jobs = drive(flows.events(_base(), "j1"), answers)
    assert [job.status for job in jobs] == ["queued", "started", "finished"] and jobs[-1].result == 1
    stream = Open(Call("GET", "/v1/jobs/j1/events"), events_timeout(30.0))
    opens = [index for index, effect in enumerate(asked) if isinstance(effect, Open)]
    assert [asked[index] for index in opens] == [stream, stream]  # the same stream again; the API sends no ids
    assert isinstance(asked[opens[1] - 1], Sleep) and asked[-1] == READ_LINE


def test_events_that_keep_ending_early_raise_transport_error_and_an_error_status_at_once() -> None:
    base = _base(Retry(attempts=2, backoff_s=0.01))
    with pytest.raises(TransportError, match="events of job j1: RemoteProtocolError"):
        drive(flows.events(base, "j1"), [httpx.Response(200), None, httpx.Response(200), None])
    with pytest.raises(NotFound):
        drive(flows.events(base, "j1"), [_status(404, code="not_found")])
    with pytest.raises(Unavailable):  # events do not retry error statuses
        drive(flows.events(base, "j1"), [_status(503, "1")])


# Bulk results.


def _line(custom_id: str, status: str = "finished") -> str:
    return json.dumps({"custom_id": custom_id, "status": status, "result": 1 if status == "finished" else None})


def test_results_cut_off_resume_at_the_lines_read_blank_lines_not_counted() -> None:
    opened = httpx.Response(200)
    answers = [opened, _line("a"), "", _line("b"), httpx.ReadError("cut"), opened, _line("c"), None]
    asked, lines = drive(flows.batch_results(_base(), "b1", 0, None, False), answers)
    assert [line.custom_id for line in lines] == ["a", "b", "c"] and lines[0] == BatchResult("a", "finished", 1)
    opens = [effect.call for effect in asked if isinstance(effect, Open)]
    assert opens == [results_call("b1", 0), results_call("b1", 2)]
    # A status filter yields fewer lines but counts them all, so the resume is exact.
    answers = [opened, _line("a"), _line("x", "failed"), httpx.ReadError("cut"), opened, _line("y", "failed"), None]
    asked, lines = drive(flows.batch_results(_base(), "b1", 5, "failed", False), answers)
    assert [line.custom_id for line in lines] == ["x", "y"]
    assert [effect.call.params for effect in asked if isinstance(effect, Open)] == [{"offset": 5}, {"offset": 7}]


def test_following_results_reads_the_batch_first_and_pauses_when_nothing_is_new() -> None:
    running = _ok({"id": "b1", "model": "m", "status": "running"})
    ended = _ok({"id": "b1", "model": "m", "status": "finished"})
    opened = httpx.Response(200)
    answers = [running, opened, _line("a"), None, running, opened, None, ended, opened, _line("b"), None]
    asked, lines = drive(flows.batch_results(_base(), "b1", 0, None, True), answers)
    assert [line.custom_id for line in lines] == ["a", "b"]
    kinds = [(type(effect).__name__, getattr(getattr(effect, "call", None), "params", None)) for effect in asked]
    assert [kind for kind in kinds if kind[0] != "ReadLine"] == [
        ("Send", None),
        ("Open", {"offset": 0}),
        ("Send", None),
        ("Open", {"offset": 1}),
        ("Sleep", None),  # that read had nothing new
        ("Send", None),
        ("Open", {"offset": 1}),
    ]
    assert Sleep(flows.POLL_S) in asked


def test_a_results_read_answered_503_is_retried_and_404_raised() -> None:
    opened = httpx.Response(200)
    asked, lines = drive(flows.batch_results(_base(), "b1", 0, None, False), [_status(503, "2"), opened, None])
    assert lines == [] and asked[1] == Sleep(2.0) and asked[2] == Open(results_call("b1", 0), 30.0)
    with pytest.raises(NotFound):
        drive(flows.batch_results(_base(), "b1", 0, None, False), [_status(404, code="not_found")])


# The two drivers over httpx, with no network.


class _CutStream(httpx.SyncByteStream, httpx.AsyncByteStream):
    """A body that breaks after its first chunks, as a dropped connection does."""

    def __init__(self, chunks: list[bytes]) -> None:
        self.chunks = chunks

    def __iter__(self) -> Iterator[bytes]:
        yield from self.chunks
        raise httpx.ReadError("the connection broke")

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for chunk in self.chunks:
            yield chunk
        raise httpx.ReadError("the connection broke")


def _api(seen: list[str]) -> httpx.MockTransport:
    """An API whose first answers are a 503, a cut results stream and a cut event stream."""
    answered: dict[str, int] = {}

    def handle(request: httpx.Request) -> httpx.Response:
        key = f"{request.method} {request.url.path}"
        seen.append(f"{key}?{request.url.query.decode()}" if request.url.query else key)
        answered[key] = answered.get(key, 0) + 1
        first = answered[key] == 1
        if key == "GET /v1/jobs/j1":
            return _status(503, "0") if first else _ok(_job("finished", result=9))
        if key == "GET /v1/batches/b1/results":
            lines = [_line(name) for name in ("a", "b", "c")]
            offset = int(request.url.params["offset"])
            if first:
                return httpx.Response(200, stream=_CutStream([(lines[0] + "\n" + lines[1] + "\n").encode()]))
            return httpx.Response(200, content="".join(line + "\n" for line in lines[offset:]).encode())
        if key == "GET /v1/jobs/j1/events":
            queued = "\n".join(_sse(_job("queued"))) + "\n"
            if first:
                return httpx.Response(200, stream=_CutStream([queued.encode()]))
            rest = "".join("\n".join(_sse(_job(status))) + "\n" for status in ("queued", "started", "finished"))
            return httpx.Response(200, content=rest.encode())
        return _status(404, code="not_found")

    return httpx.MockTransport(handle)


EXPECTED_REQUESTS = [
    "GET /v1/jobs/j1",
    "GET /v1/jobs/j1",
    "GET /v1/batches/b1/results?offset=0",
    "GET /v1/batches/b1/results?offset=2",
    "GET /v1/jobs/j1/events",
    "GET /v1/jobs/j1/events",
    "GET /v1/models/nope",
]
QUICK = Retry(attempts=3, backoff_s=0.001)


def test_the_sync_client_drives_the_flows_over_httpx() -> None:
    seen: list[str] = []
    with Client("http://api", transport=_api(seen), retry=QUICK) as client:
        job = client.get("j1")
        lines = list(client.batch_results("b1"))
        statuses = [event.status for event in client.events("j1")]
        with pytest.raises(NotFound):
            client.model("nope")
    assert job == Job.from_dict(_job("finished", result=9))
    assert [line.custom_id for line in lines] == ["a", "b", "c"]
    assert statuses == ["queued", "started", "finished"] and seen == EXPECTED_REQUESTS


def test_the_async_client_drives_the_same_flows_over_httpx() -> None:
    seen: list[str] = []

    async def use() -> tuple[Job, list[BatchResult], list[str]]:
        async with AsyncClient("http://api", transport=_api(seen), retry=QUICK) as client:
            job = await client.get("j1")
            lines = [line async for line in client.batch_results("b1")]
            statuses = [event.status async for event in client.events("j1")]
            with pytest.raises(NotFound):
                await client.model("nope")
            return job, lines, statuses

    job, lines, statuses = asyncio.run(use())
    assert job == Job.from_dict(_job("finished", result=9))
    assert [line.custom_id for line in lines] == ["a", "b", "c"]
    assert statuses == ["queued", "started", "finished"] and seen == EXPECTED_REQUESTS


class _Held(httpx.SyncByteStream, httpx.AsyncByteStream):
    """An event stream that would go on, noting when it is closed."""

    def __init__(self, closed: list[str]) -> None:
        self.closed = closed
        self.events = [("\n".join(_sse(_job(status))) + "\n").encode() for status in ("queued", "started")]

    def __iter__(self) -> Iterator[bytes]:
        yield from self.events

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for event in self.events:
            yield event

    def close(self) -> None:
        self.closed.append("sync")

    async def aclose(self) -> None:
        self.closed.append("async")


def test_leaving_an_event_loop_early_closes_its_stream() -> None:
    closed: list[str] = []
    transport = httpx.MockTransport(lambda request: httpx.Response(200, stream=_Held(closed)))
    with Client("http://api", transport=transport) as client:
        events = client.events("j1")
        assert next(events).status == "queued" and closed == []
        events.close()
    assert closed == ["sync"]

    async def use() -> None:
        async with AsyncClient("http://api", transport=transport) as client:
            events = client.events("j1")
            assert (await anext(events)).status == "queued" and closed == ["sync"]
            await events.aclose()
            assert closed == ["sync", "async"]

    asyncio.run(use())
