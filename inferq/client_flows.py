"""The SDK's control flow, written once and without I/O: ``Client`` and ``AsyncClient`` only drive it.

Each operation is a generator (a flow) that yields what it needs done and is sent the outcome, as httpx's
``Auth.auth_flow`` yields requests and receives responses:

    Send(call)      send once           -> the response, its body read
    Open(call, t)   open a stream       -> the response (on an error status: its body read, the stream closed)
    READ_LINE       the stream's line   -> the next line, or None at its end (the stream then closed)
    Sleep(s)        wait s seconds      -> None
    Emit(item)      an item for the caller of ``events()`` or ``batch_results()``

An httpx transport error is thrown into the flow at the ``yield`` that asked for the I/O (a stream is closed
first), so retries, long-poll fallbacks, event reconnects and offset resumes are plain ``try``/``except`` here.
``inferq.client_io`` holds the two drivers: httpx.Client with time.sleep, httpx.AsyncClient with asyncio.sleep.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Generator
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import httpx

from inferq.client_http import (
    SSE,
    Call,
    batch_call,
    batch_path,
    events_path,
    events_timeout,
    finished,
    model_list,
    raise_for,
    results_call,
    retry_delay_s,
    submit_call,
    wait_call,
)
from inferq.client_types import (
    Batch,
    BatchResult,
    InvalidInput,
    Job,
    Model,
    ModelList,
    Retry,
    Tenant,
    TransportError,
    WaitTimeout,
    build,
)

T = TypeVar("T")
R = TypeVar("R")

# Between polls of a job that a long-poll did not hold, and between reads of a followed batch that had no new line.
POLL_S = 0.5


@dataclass(frozen=True)
class Send:
    """Send ``call`` once; the outcome is its response, body read."""

    call: Call


@dataclass(frozen=True)
class Open:
    """Open ``call`` as a stream, with its own ``timeout``; the outcome is the response, its lines not yet read."""

    call: Call
    timeout: httpx.Timeout | float


@dataclass(frozen=True)
class ReadLine:
    """The open stream's next line; None at its end."""


@dataclass(frozen=True)
class Sleep:
    """Wait before going on."""

    seconds: float


@dataclass(frozen=True)
class Emit(Generic[T]):
    """An item for the caller of an iterating method."""

    item: T


READ_LINE = ReadLine()
Effect = Send | Open | ReadLine | Sleep
# A flow that ends with a value (submit, wait, …), and a feed that hands items to its caller (events, results).
Flow = Generator[Effect, Any, R]
Feed = Generator[Effect | Emit[T], Any, None]


class Base:
    """What the flows read: the API's address, the per-request timeout, the retry policy, the longest wait."""

    def __init__(
        self, base_url: str, api_key: str | None, timeout: float, retry: Retry | None, max_wait_s: float
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        self.retry = retry or Retry()
        # The longest wait one request asks of the API (INFERQ_MAX_WAIT_S there, 60 s by default).
        self.max_wait_s = max_wait_s
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}


def advance(feed: Feed[T], outcome: Any, error: httpx.TransportError | None) -> Effect | Emit[T] | None:
    """What ``feed`` asks for next, sent the outcome of its last ask or thrown the transport error met; None: done."""
    try:
        return feed.throw(error) if error is not None else feed.send(outcome)
    except StopIteration:
        return None


def returning(flow: Flow[R]) -> Feed[R]:
    """``flow`` as a feed of one item, its value: so one driving loop serves both kinds."""
    yield Emit((yield from flow))


def send(base: Base, call: Call) -> Flow[httpx.Response]:
    """``call``'s response, retried on connection errors, 429 and 503 as ``base.retry`` says; errors raised."""
    attempt = 0
    while True:
        attempt += 1
        try:
            response: httpx.Response = yield Send(call)
        except httpx.TransportError as exc:
            delay = retry_delay_s(base.retry, call, attempt, exc)
            if delay is None:
                raise TransportError(f"{call.method} {base.base_url}{call.path}: {exc!r}") from exc
        else:
            delay = retry_delay_s(base.retry, call, attempt, response)
            if delay is None:
                raise_for(response)
                return response
        yield Sleep(delay)


def submit(base: Base, model: str, options: dict[str, Any]) -> Flow[Job]:
    """``Client.submit``: the queued job."""
    return Job.from_dict((yield from send(base, submit_call(model, options))).json())


def get(base: Base, job_id: str) -> Flow[Job]:
    """``Client.get``: the job as it is now."""
    return Job.from_dict((yield from send(base, wait_call(job_id, 0))).json())


def wait(base: Base, job_id: str, timeout: float) -> Flow[Job]:
    """``Client.wait``: long-polls (``?wait=``), then polls, for up to ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    long_poll = True
    while True:
        wait_s = max(0.0, min(deadline - time.monotonic(), base.max_wait_s)) if long_poll else 0.0
        asked = time.monotonic()
        try:
            job = Job.from_dict((yield from send(base, wait_call(job_id, wait_s))).json())
        except InvalidInput:
            if not wait_s:
                raise
            long_poll = False  # the API caps waits below max_wait_s: poll instead
            continue
        if job.done:
            return finished(job)
        left = deadline - time.monotonic()
        if left <= 0:
            raise WaitTimeout(job, timeout)
        if time.monotonic() - asked < wait_s / 2 or not long_poll:
            yield Sleep(min(POLL_S, left))


def run(base: Base, model: str, options: dict[str, Any], timeout: float) -> Flow[Job]:
    """``Client.run``: a submit with ``Prefer: wait``, then ``wait``, ``timeout`` seconds in all."""
    deadline = time.monotonic() + timeout
    options = options | {"idempotency_key": options["idempotency_key"] or uuid.uuid4().hex}
    try:
        call = submit_call(model, dict(options), min(timeout, base.max_wait_s))
        job = Job.from_dict((yield from send(base, call)).json())
    except InvalidInput as exc:
        if "Prefer" not in exc.message:
            raise
        job = Job.from_dict((yield from send(base, submit_call(model, options))).json())  # the API caps waits lower
    if job.done:
        return finished(job)
    return (yield from wait(base, job.id, max(0.0, deadline - time.monotonic())))


def cancel(base: Base, job_id: str) -> Flow[Job]:
    """``Client.cancel``: sent again only if it was never sent."""
    return Job.from_dict((yield from send(base, Call("POST", f"/v1/jobs/{job_id}/cancel", repeatable=False))).json())


def events(base: Base, job_id: str) -> Feed[Job]:
    """``Client.events``: the job at each status change, to its terminal one; a stream cut off is opened again."""
    call = Call("GET", events_path(job_id))
    last, attempt = None, 0
    while True:
        try:
            response: httpx.Response = yield Open(call, events_timeout(base.timeout))
            raise_for(response)
            parser = SSE()
            while (line := (yield READ_LINE)) is not None:
                event = parser.feed(line)
                if event is None:
                    continue
                job = Job.from_dict(json.loads(event[1]))
                attempt = 0
                if job.status != last:  # a stream opened again starts with the status already seen
                    last = job.status
                    yield Emit(job)
                if job.done:
                    return
            outcome: httpx.TransportError = httpx.RemoteProtocolError("the event stream ended early")
        except httpx.TransportError as exc:
            outcome = exc
        attempt += 1
        delay = retry_delay_s(base.retry, Call("GET", ""), attempt, outcome)
        if delay is None:
            raise TransportError(f"events of job {job_id}: {outcome!r}") from outcome
        yield Sleep(delay)


def models(base: Base) -> Flow[ModelList]:
    """``Client.models``."""
    return model_list((yield from send(base, Call("GET", "/v1/models"))).json())


def tenant(base: Base) -> Flow[Tenant]:
    """``Client.tenant``."""
    return build(Tenant, (yield from send(base, Call("GET", "/v1/tenants/me"))).json())


def reload_models(base: Base) -> Flow[dict[str, list[str]]]:
    """``Client.reload_models``: safe to send twice (it only reads the repository again)."""
    return dict((yield from send(base, Call("POST", "/v1/models/reload"))).json())


def set_rollout(base: Base, name: str, traffic: dict[int, float] | None, ramp: dict[str, Any] | None) -> Flow[Model]:
    """``Client.set_rollout``: safe to send twice (the same rollout again)."""
    body: dict[str, Any] = {} if ramp is None else {"ramp": ramp}
    if traffic is not None:
        body["traffic"] = {str(v): s for v, s in traffic.items()}
    call = Call("PUT", f"/v1/models/{name}/rollout", json=body)
    return Model.from_dict((yield from send(base, call)).json())


def clear_rollout(base: Base, name: str) -> Flow[Model]:
    """``Client.clear_rollout``."""
    call = Call("DELETE", f"/v1/models/{name}/rollout", repeatable=False)
    return Model.from_dict((yield from send(base, call)).json())


def model(base: Base, name: str) -> Flow[Model]:
    """``Client.model``."""
    return Model.from_dict((yield from send(base, Call("GET", f"/v1/models/{name}"))).json())


def create_batch(base: Base, model: str, items: Any, options: dict[str, Any]) -> Flow[Batch]:
    """``Client.create_batch``: one upload, retried with its Idempotency-Key."""
    return Batch.from_dict((yield from send(base, batch_call(model, items, options))).json())


def get_batch(base: Base, batch_id: str) -> Flow[Batch]:
    """``Client.get_batch``."""
    return Batch.from_dict((yield from send(base, Call("GET", batch_path(batch_id)))).json())


def cancel_batch(base: Base, batch_id: str) -> Flow[Batch]:
    """``Client.cancel_batch``: sent again only if it was never sent."""
    call = Call("POST", batch_path(batch_id, "/cancel"), repeatable=False)
    return Batch.from_dict((yield from send(base, call)).json())


def _result_line(raw: str, status: str | None) -> BatchResult | None:
    """The result line, or None for a blank line or one of another status than asked for."""
    if not raw.strip():
        return None
    line = BatchResult.from_dict(json.loads(raw))
    return line if status is None or line.status == status else None


def batch_results(base: Base, batch_id: str, offset: int, status: str | None, follow: bool) -> Feed[BatchResult]:
    """``Client.batch_results``: lines from ``offset`` on; a read cut off resumes at the lines it had read."""
    attempt = 0
    while True:
        ended = follow and (yield from get_batch(base, batch_id)).done  # before reading: that read then holds all
        before = offset
        call = results_call(batch_id, offset)
        try:
            response: httpx.Response = yield Open(call, base.timeout)
            if response.status_code >= 400:
                attempt += 1
                delay = retry_delay_s(base.retry, call, attempt, response)
                if delay is None:
                    raise_for(response)
                yield Sleep(delay or 0)
                continue
            while (raw := (yield READ_LINE)) is not None:
                line = _result_line(raw, status)
                offset += bool(raw.strip())
                attempt = 0
                if line is not None:
                    yield Emit(line)
        except httpx.TransportError as exc:
            attempt += 1
            delay = retry_delay_s(base.retry, call, attempt, exc)
            if delay is None:
                raise TransportError(f"results of batch {batch_id}: {exc!r}") from exc
            yield Sleep(delay)
            continue
        if not follow or ended:
            return
        if offset == before:
            yield Sleep(POLL_S)
