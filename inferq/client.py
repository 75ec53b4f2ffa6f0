"""inferq's Python SDK: ``Client`` and ``AsyncClient`` over the HTTP API (httpx only; torch is never imported).

    from inferq.client import Client

    with Client("http://127.0.0.1:8000") as inferq:
        job = inferq.run("digits", image="digit.png", timeout=30)
        print(job.result["label"])

Requests are retried with backoff on connection errors, 429 and 503, never sooner than ``Retry-After``. Every
submit carries an ``Idempotency-Key`` (a uuid4 unless given), so a retried submit never makes a second job.
Bulk batches (``create_batch``, ``get_batch``, ``batch_results``, ``cancel_batch``) are in ``inferq.client_bulk``.
What every method does is written once, without I/O, in ``inferq.client_flows``; both clients only drive it.

Errors and results are in ``inferq.client_types`` (its docstring draws the error tree), all importable from here.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import hmac
import json
import time
from collections.abc import AsyncIterator, Iterator, Mapping
from typing import Any

import httpx

from inferq import client_flows as flows
from inferq.client_bulk import AsyncBulkMethods, BulkMethods
from inferq.client_flows import POLL_S as POLL_S  # between polls; its old home
from inferq.client_types import (
    APIError,
    Batch,
    BatchResult,
    BatchUrls,
    Conflict,
    Forbidden,
    InferqError,
    InvalidInput,
    InvalidModel,
    Job,
    JobFailed,
    JobUrls,
    Model,
    ModelList,
    ModelVersion,
    NotFound,
    PayloadTooLarge,
    QueueFull,
    RefusedLine,
    Retry,
    Tenant,
    TransportError,
    Unauthorized,
    Unavailable,
    UnsupportedMedia,
    WaitTimeout,
    WebhookAttempt,
    WebhookInfo,
    WebhookVerificationError,
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
    "Forbidden",
    "InferqError",
    "InvalidInput",
    "InvalidModel",
    "Job",
    "JobFailed",
    "JobUrls",
    "Model",
    "ModelVersion",
    "ModelList",
    "Tenant",
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
        version: int | None = None,
        traceparent: str | None = None,
    ) -> Job:
        """Queue one input for ``model`` and return the queued job at once.

        Give exactly one of ``file`` (a path, bytes or binary file, sent as a multipart upload), ``image`` (the
        same, or a PIL image) or ``inputs`` (JSON: a tensor's nested list, a text, an object). ``priority`` is
        "interactive" or "bulk", sent only when given. ``version`` pins the model's version the job runs on (else
        the model's traffic shares route it). Without ``idempotency_key`` one is made, so a retried submit returns
        the same job. ``traceparent`` (W3C) continues the caller's trace; without it, the current OpenTelemetry
        context is sent when the caller's process has one.
        """
        options = {"file": file, "image": image, "inputs": inputs, "webhook": webhook, "result_ttl": result_ttl}
        options |= {"ttl": ttl, "priority": priority, "idempotency_key": idempotency_key, "version": version}
        options["traceparent"] = traceparent
        return self._run(flows.submit(self, model, options))

    def get(self, job_id: str) -> Job:
        """The job as it is now; ``NotFound`` if unknown or expired."""
        return self._run(flows.get(self, job_id))

    def wait(self, job_id: str, timeout: float = 60.0) -> Job:
        """The finished job, long-polling (``?wait=``) and then polling for up to ``timeout`` seconds.

        Raises ``JobFailed`` if it failed, was canceled or expired, ``WaitTimeout`` if it had not ended.
        """
        return self._run(flows.wait(self, job_id, timeout))

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
        version: int | None = None,
        traceparent: str | None = None,
        timeout: float = 60.0,
    ) -> Job:
        """Submit and return the finished job: ``Prefer: wait`` first, then ``wait()``, ``timeout`` seconds in all."""
        options = {"file": file, "image": image, "inputs": inputs, "webhook": webhook, "result_ttl": result_ttl}
        options |= {"ttl": ttl, "priority": priority, "idempotency_key": idempotency_key, "version": version}
        options["traceparent"] = traceparent
        return self._run(flows.run(self, model, options, timeout))

    def cancel(self, job_id: str) -> Job:
        """Cancel a queued or running job; ``Conflict`` if it already ended."""
        return self._run(flows.cancel(self, job_id))

    def events(self, job_id: str) -> Iterator[Job]:
        """The job at each status change (Server-Sent Events), ending with its terminal one; reconnects if cut."""
        yield from self._iterate(flows.events(self, job_id))

    def models(self) -> ModelList:
        """Every model the API serves, and the model folders it left out."""
        return self._run(flows.models(self))

    def tenant(self) -> Tenant:
        """The tenant this client's API key belongs to: its name, weight, quotas and their use now."""
        return self._run(flows.tenant(self))

    def reload_models(self) -> dict[str, list[str]]:
        """Have the API read its model repository again now: the served names added, removed, changed, invalid."""
        return self._run(flows.reload_models(self))

    def model(self, name: str) -> Model:
        """One model; ``NotFound`` if the API does not serve it."""
        return self._run(flows.model(self, name))

    def set_rollout(
        self, name: str, traffic: dict[int, float] | None = None, ramp: dict[str, Any] | None = None
    ) -> Model:
        """Share the model's unpinned submits between its versions, over its config.json's rollout: ``traffic``
        percent per version (``{1: 90, 2: 10}``), a ``ramp`` (``{"version": 2, "steps": [10, 50, 100],
        "interval_s": 600}``), or both. Returns the model as it is now routed."""
        return self._run(flows.set_rollout(self, name, traffic, ramp))

    def clear_rollout(self, name: str) -> Model:
        """Go back to the rollout of the model's config.json; ``NotFound`` if none was set through the API."""
        return self._run(flows.clear_rollout(self, name))


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
        version: int | None = None,
        traceparent: str | None = None,
    ) -> Job:
        """Queue one input for ``model``; as ``Client.submit``."""
        options = {"file": file, "image": image, "inputs": inputs, "webhook": webhook, "result_ttl": result_ttl}
        options |= {"ttl": ttl, "priority": priority, "idempotency_key": idempotency_key, "version": version}
        options["traceparent"] = traceparent
        return await self._run(flows.submit(self, model, options))

    async def get(self, job_id: str) -> Job:
        """The job as it is now; ``NotFound`` if unknown or expired."""
        return await self._run(flows.get(self, job_id))

    async def wait(self, job_id: str, timeout: float = 60.0) -> Job:
        """The finished job, waiting up to ``timeout`` seconds; as ``Client.wait``."""
        return await self._run(flows.wait(self, job_id, timeout))

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
        version: int | None = None,
        traceparent: str | None = None,
        timeout: float = 60.0,
    ) -> Job:
        """Submit and return the finished job; as ``Client.run``."""
        options = {"file": file, "image": image, "inputs": inputs, "webhook": webhook, "result_ttl": result_ttl}
        options |= {"ttl": ttl, "priority": priority, "idempotency_key": idempotency_key, "version": version}
        options["traceparent"] = traceparent
        return await self._run(flows.run(self, model, options, timeout))

    async def cancel(self, job_id: str) -> Job:
        """Cancel a queued or running job; ``Conflict`` if it already ended."""
        return await self._run(flows.cancel(self, job_id))

    async def events(self, job_id: str) -> AsyncIterator[Job]:
        """The job at each status change, ending with its terminal one; as ``Client.events``."""
        async with contextlib.aclosing(self._iterate(flows.events(self, job_id))) as jobs:
            async for job in jobs:
                yield job

    async def models(self) -> ModelList:
        """Every model the API serves, and the model folders it left out."""
        return await self._run(flows.models(self))

    async def tenant(self) -> Tenant:
        """The tenant this client's API key belongs to; as ``Client.tenant``."""
        return await self._run(flows.tenant(self))

    async def reload_models(self) -> dict[str, list[str]]:
        """Have the API read its model repository again now; as ``Client.reload_models``."""
        return await self._run(flows.reload_models(self))

    async def model(self, name: str) -> Model:
        """One model; ``NotFound`` if the API does not serve it."""
        return await self._run(flows.model(self, name))

    async def set_rollout(
        self, name: str, traffic: dict[int, float] | None = None, ramp: dict[str, Any] | None = None
    ) -> Model:
        """Share the model's unpinned submits between its versions; as ``Client.set_rollout``."""
        return await self._run(flows.set_rollout(self, name, traffic, ramp))

    async def clear_rollout(self, name: str) -> Model:
        """Go back to the rollout of the model's config.json; as ``Client.clear_rollout``."""
        return await self._run(flows.clear_rollout(self, name))


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
