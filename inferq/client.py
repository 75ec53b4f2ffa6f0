"""inferq's Python SDK: ``Client`` and ``AsyncClient`` over the HTTP API (httpx only; torch is never imported).

    from inferq.client import Client

    with Client("http://127.0.0.1:8000") as inferq:
        job = inferq.run("digits", image="digit.png", timeout=30)
        print(job.result["label"])

Requests are retried with backoff on connection errors, 429 and 503, never sooner than ``Retry-After``. Every
submit carries an ``Idempotency-Key`` (a uuid4 unless given), so a retried submit never makes a second job.
Bulk batches (``create_batch``, ``get_batch``, ``batch_results``, ``cancel_batch``) are in ``inferq.client_bulk``.

Errors and results are in ``inferq.client_types`` (its docstring draws the error tree), all importable from here.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import json
import time
import uuid
from collections.abc import AsyncIterator, Iterator, Mapping
from typing import Any

import httpx

from inferq.client_bulk import AsyncBulkMethods, BulkMethods
from inferq.client_http import SSE, Call, events_path, finished, model_list, raise_for, submit_call
from inferq.client_types import (
    APIError,
    Batch,
    BatchResult,
    BatchUrls,
    Conflict,
    InferqError,
    InvalidInput,
    InvalidModel,
    Job,
    JobFailed,
    JobUrls,
    Model,
    ModelList,
    NotFound,
    PayloadTooLarge,
    QueueFull,
    RefusedLine,
    Retry,
    TransportError,
    Unauthorized,
    Unavailable,
    UnsupportedMedia,
    WaitTimeout,
    WebhookAttempt,
    WebhookInfo,
    WebhookVerificationError,
    build,
    retry_after_s,
)

__all__ = [
    "APIError",
    "AsyncClient",
    "Batch",
    "BatchResult",
    "BatchUrls",
    "Client",
    "Conflict",
    "InferqError",
    "InvalidInput",
    "InvalidModel",
    "Job",
    "JobFailed",
    "JobUrls",
    "Model",
    "ModelList",
    "NotFound",
    "PayloadTooLarge",
    "QueueFull",
    "RefusedLine",
    "Retry",
    "TransportError",
    "Unauthorized",
    "Unavailable",
    "UnsupportedMedia",
    "WaitTimeout",
    "WebhookAttempt",
    "WebhookInfo",
    "WebhookVerificationError",
    "retry_after_s",
    "verify_webhook",
]

POLL_S = 0.5


class Client(BulkMethods):
    """A synchronous client of one inferq API; use it as a context manager, or call ``close()``."""

    def __init__(
        self,
        base_url: str,
        api_key: str | None = None,
        *,
        timeout: float = 30.0,
        retry: Retry | None = None,
        max_wait_s: float = 60.0,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        """``timeout``: seconds per request, on top of any wait it asks for; ``retry``: the retry policy."""
        super().__init__(base_url, api_key, timeout, retry, max_wait_s)
        self._http = httpx.Client(base_url=self.base_url, transport=transport)

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the connections."""
        self._http.close()

    def _send(self, call: Call) -> httpx.Response:
        attempt = 0
        while True:
            attempt += 1
            try:
                response = self._http.request(call.method, call.path, files=call.files, **self._kwargs(call))
            except httpx.TransportError as exc:
                delay = self._delay(call, attempt, exc)
                if delay is None:
                    raise TransportError(f"{call.method} {self.base_url}{call.path}: {exc!r}") from exc
            else:
                delay = self._delay(call, attempt, response)
                if delay is None:
                    raise_for(response)
                    return response
            time.sleep(delay)

    def submit(
        self,
        model: str,
        *,
        file: Any = None,
        image: Any = None,
        inputs: Any = None,
        webhook: str | None = None,
        result_ttl: int | None = None,
        ttl: int | None = None,
        priority: str | None = None,
        idempotency_key: str | None = None,
    ) -> Job:
        """Queue one input for ``model`` and return the queued job at once.

        Give exactly one of ``file`` (a path, bytes or binary file, sent as a multipart upload), ``image`` (the
        same, or a PIL image) or ``inputs`` (JSON: a tensor's nested list, a text, an object). ``priority`` is
        "interactive" or "bulk", sent only when given. Without ``idempotency_key`` one is made, so a retried
        submit returns the same job.
        """
        options = {"file": file, "image": image, "inputs": inputs, "webhook": webhook, "result_ttl": result_ttl}
        options |= {"ttl": ttl, "priority": priority, "idempotency_key": idempotency_key}
        return Job.from_dict(self._send(submit_call(model, options)).json())

    def get(self, job_id: str) -> Job:
        """The job as it is now; ``NotFound`` if unknown or expired."""
        return Job.from_dict(self._send(self._wait_call(job_id, 0)).json())

    def wait(self, job_id: str, timeout: float = 60.0) -> Job:
        """The finished job, long-polling (``?wait=``) and then polling for up to ``timeout`` seconds.

        Raises ``JobFailed`` if it failed, was canceled or expired, ``WaitTimeout`` if it had not ended.
        """
        deadline = time.monotonic() + timeout
        long_poll = True
        while True:
            wait_s = max(0.0, min(deadline - time.monotonic(), self.max_wait_s)) if long_poll else 0.0
            asked = time.monotonic()
            try:
                job = Job.from_dict(self._send(self._wait_call(job_id, wait_s)).json())
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
                time.sleep(min(POLL_S, left))

    def run(
        self,
        model: str,
        *,
        file: Any = None,
        image: Any = None,
        inputs: Any = None,
        webhook: str | None = None,
        result_ttl: int | None = None,
        ttl: int | None = None,
        priority: str | None = None,
        idempotency_key: str | None = None,
        timeout: float = 60.0,
    ) -> Job:
        """Submit and return the finished job: ``Prefer: wait`` first, then ``wait()``, ``timeout`` seconds in all."""
        deadline = time.monotonic() + timeout
        options = {"file": file, "image": image, "inputs": inputs, "webhook": webhook, "result_ttl": result_ttl}
        options |= {"ttl": ttl, "priority": priority, "idempotency_key": idempotency_key or uuid.uuid4().hex}
        try:
            job = Job.from_dict(self._send(submit_call(model, dict(options), min(timeout, self.max_wait_s))).json())
        except InvalidInput as exc:
            if "Prefer" not in exc.message:
                raise
            job = Job.from_dict(self._send(submit_call(model, options)).json())  # the API caps waits lower
        if job.done:
            return finished(job)
        return self.wait(job.id, max(0.0, deadline - time.monotonic()))

    def cancel(self, job_id: str) -> Job:
        """Cancel a queued or running job; ``Conflict`` if it already ended."""
        return Job.from_dict(self._send(Call("POST", f"/v1/jobs/{job_id}/cancel", repeatable=False)).json())

    def events(self, job_id: str) -> Iterator[Job]:
        """The job at each status change (Server-Sent Events), ending with its terminal one; reconnects if cut."""
        last, attempt = None, 0
        while True:
            try:
                with self._http.stream(
                    "GET", events_path(job_id), headers=self._headers, timeout=self._events_timeout()
                ) as response:
                    if response.status_code >= 400:
                        response.read()
                        raise_for(response)
                    parser = SSE()
                    for line in response.iter_lines():
                        event = parser.feed(line)
                        if event is None:
                            continue
                        job = Job.from_dict(json.loads(event[1]))
                        attempt = 0
                        if job.status != last:
                            last = job.status
                            yield job
                        if job.done:
                            return
                outcome: httpx.TransportError = httpx.RemoteProtocolError("the event stream ended early")
            except httpx.TransportError as exc:
                outcome = exc
            attempt += 1
            delay = self._delay(Call("GET", ""), attempt, outcome)
            if delay is None:
                raise TransportError(f"events of job {job_id}: {outcome!r}") from outcome
            time.sleep(delay)

    def models(self) -> ModelList:
        """Every model the API serves, and the model folders it left out."""
        return model_list(self._send(Call("GET", "/v1/models")).json())

    def model(self, name: str) -> Model:
        """One model; ``NotFound`` if the API does not serve it."""
        return build(Model, self._send(Call("GET", f"/v1/models/{name}")).json())


class AsyncClient(AsyncBulkMethods):
    """The same client for asyncio: every method of ``Client``, awaited; ``events()`` is an async iterator."""

    def __init__(
        self,
        base_url: str,
        api_key: str | None = None,
        *,
        timeout: float = 30.0,
        retry: Retry | None = None,
        max_wait_s: float = 60.0,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        """As ``Client``."""
        super().__init__(base_url, api_key, timeout, retry, max_wait_s)
        self._http = httpx.AsyncClient(base_url=self.base_url, transport=transport)

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the connections."""
        await self._http.aclose()

    async def _send(self, call: Call) -> httpx.Response:
        attempt = 0
        while True:
            attempt += 1
            try:
                response = await self._http.request(call.method, call.path, files=call.files, **self._kwargs(call))
            except httpx.TransportError as exc:
                delay = self._delay(call, attempt, exc)
                if delay is None:
                    raise TransportError(f"{call.method} {self.base_url}{call.path}: {exc!r}") from exc
            else:
                delay = self._delay(call, attempt, response)
                if delay is None:
                    raise_for(response)
                    return response
            await asyncio.sleep(delay)

    async def submit(
        self,
        model: str,
        *,
        file: Any = None,
        image: Any = None,
        inputs: Any = None,
        webhook: str | None = None,
        result_ttl: int | None = None,
        ttl: int | None = None,
        priority: str | None = None,
        idempotency_key: str | None = None,
    ) -> Job:
        """Queue one input for ``model``; as ``Client.submit``."""
        options = {"file": file, "image": image, "inputs": inputs, "webhook": webhook, "result_ttl": result_ttl}
        options |= {"ttl": ttl, "priority": priority, "idempotency_key": idempotency_key}
        return Job.from_dict((await self._send(submit_call(model, options))).json())

    async def get(self, job_id: str) -> Job:
        """The job as it is now; ``NotFound`` if unknown or expired."""
        return Job.from_dict((await self._send(self._wait_call(job_id, 0))).json())

    async def wait(self, job_id: str, timeout: float = 60.0) -> Job:
        """The finished job, waiting up to ``timeout`` seconds; as ``Client.wait``."""
        deadline = time.monotonic() + timeout
        long_poll = True
        while True:
            wait_s = max(0.0, min(deadline - time.monotonic(), self.max_wait_s)) if long_poll else 0.0
            asked = time.monotonic()
            try:
                job = Job.from_dict((await self._send(self._wait_call(job_id, wait_s))).json())
            except InvalidInput:
                if not wait_s:
                    raise
                long_poll = False
                continue
            if job.done:
                return finished(job)
            left = deadline - time.monotonic()
            if left <= 0:
                raise WaitTimeout(job, timeout)
            if time.monotonic() - asked < wait_s / 2 or not long_poll:
                await asyncio.sleep(min(POLL_S, left))

    async def run(
        self,
        model: str,
        *,
        file: Any = None,
        image: Any = None,
        inputs: Any = None,
        webhook: str | None = None,
        result_ttl: int | None = None,
        ttl: int | None = None,
        priority: str | None = None,
        idempotency_key: str | None = None,
        timeout: float = 60.0,
    ) -> Job:
        """Submit and return the finished job; as ``Client.run``."""
        deadline = time.monotonic() + timeout
        options = {"file": file, "image": image, "inputs": inputs, "webhook": webhook, "result_ttl": result_ttl}
        options |= {"ttl": ttl, "priority": priority, "idempotency_key": idempotency_key or uuid.uuid4().hex}
        try:
            call = submit_call(model, dict(options), min(timeout, self.max_wait_s))
            job = Job.from_dict((await self._send(call)).json())
        except InvalidInput as exc:
            if "Prefer" not in exc.message:
                raise
            job = Job.from_dict((await self._send(submit_call(model, options))).json())
        if job.done:
            return finished(job)
        return await self.wait(job.id, max(0.0, deadline - time.monotonic()))

    async def cancel(self, job_id: str) -> Job:
        """Cancel a queued or running job; ``Conflict`` if it already ended."""
        return Job.from_dict((await self._send(Call("POST", f"/v1/jobs/{job_id}/cancel", repeatable=False))).json())

    async def events(self, job_id: str) -> AsyncIterator[Job]:
        """The job at each status change, ending with its terminal one; as ``Client.events``."""
        last, attempt = None, 0
        while True:
            try:
                async with self._http.stream(
                    "GET", events_path(job_id), headers=self._headers, timeout=self._events_timeout()
                ) as response:
                    if response.status_code >= 400:
                        await response.aread()
                        raise_for(response)
                    parser = SSE()
                    async for line in response.aiter_lines():
                        event = parser.feed(line)
                        if event is None:
                            continue
                        job = Job.from_dict(json.loads(event[1]))
                        attempt = 0
                        if job.status != last:
                            last = job.status
                            yield job
                        if job.done:
                            return
                outcome: httpx.TransportError = httpx.RemoteProtocolError("the event stream ended early")
            except httpx.TransportError as exc:
                outcome = exc
            attempt += 1
            delay = self._delay(Call("GET", ""), attempt, outcome)
            if delay is None:
                raise TransportError(f"events of job {job_id}: {outcome!r}") from outcome
            await asyncio.sleep(delay)

    async def models(self) -> ModelList:
        """Every model the API serves, and the model folders it left out."""
        return model_list((await self._send(Call("GET", "/v1/models"))).json())

    async def model(self, name: str) -> Model:
        """One model; ``NotFound`` if the API does not serve it."""
        return build(Model, (await self._send(Call("GET", f"/v1/models/{name}"))).json())


def verify_webhook(secret: str | bytes, headers: Mapping[str, str], body: bytes | str, tolerance_s: int = 300) -> Job:
    """The job a webhook delivered, once its Standard Webhooks signature and timestamp check out.

    The rules of the Standard Webhooks libraries: ``secret`` is ``whsec_<base64>`` (the prefix optional) or the
    raw key; any of the space-separated ``v1,<base64>`` signatures of ``id.timestamp.body`` may match; the
    timestamp must be within ``tolerance_s`` of now either way. Raises ``WebhookVerificationError`` otherwise.
    """
    if isinstance(secret, str):
        secret = base64.b64decode(secret.removeprefix("whsec_") + "==")
    if not secret:
        raise WebhookVerificationError("the webhook secret is empty")
    lowered = {name.lower(): value for name, value in headers.items()}
    msg_id, stamp, signatures = (lowered.get(f"webhook-{name}") for name in ("id", "timestamp", "signature"))
    if not (msg_id and stamp and signatures):
        raise WebhookVerificationError("webhook-id, webhook-timestamp and webhook-signature are required")
    try:
        timestamp = int(float(stamp))
    except ValueError:
        raise WebhookVerificationError(f"webhook-timestamp is not a time: {stamp[:40]!r}") from None
    if abs(time.time() - timestamp) > tolerance_s:
        raise WebhookVerificationError(f"webhook-timestamp is more than {tolerance_s} s from now")
    data = body.encode() if isinstance(body, str) else body
    expected = hmac.new(secret, f"{msg_id}.{timestamp}.".encode() + data, hashlib.sha256).digest()
    for candidate in signatures.split(" "):
        version, _, signature = candidate.partition(",")
        try:
            given = base64.b64decode(signature, validate=True)
        except ValueError:
            continue
        if version == "v1" and hmac.compare_digest(expected, given):
            return Job.from_dict(json.loads(data))
    raise WebhookVerificationError("no webhook-signature matches the body")
