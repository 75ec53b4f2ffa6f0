"""How the SDK's calls are made and read, the same for ``Client`` and ``AsyncClient``: each call's request, an
upload's bytes, error bodies as exceptions, Server-Sent Events, and when to retry."""

from __future__ import annotations

import io
import json
import mimetypes
import os
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from inferq.client_types import InvalidModel, Job, JobFailed, Model, ModelList, Retry, build, error_class, retry_after_s


@dataclass
class Call:
    """One request the SDK makes, before it is sent."""

    method: str
    path: str
    params: dict[str, Any] | None = None
    headers: dict[str, str] = field(default_factory=dict)
    json: Any = None
    data: dict[str, str] | None = None
    files: dict[str, tuple[str, bytes, str]] | None = None
    content: bytes | None = None
    timeout_s: float | None = None
    # Safe to send twice (a GET, or a submit with its Idempotency-Key); otherwise retried only when never sent.
    repeatable: bool = True


def upload(value: Any) -> tuple[str, bytes, str]:
    """(file name, bytes, content type) of a path, bytes, a binary file object, a PIL image, or a tuple.

    A tuple is ``(file name, bytes)`` or ``(file name, bytes, content type)``, as httpx takes files; without a
    content type it is guessed from the name.
    """
    if isinstance(value, tuple) and len(value) in (2, 3) and isinstance(value[1], bytes | bytearray | memoryview):
        name = str(value[0])
        guessed = mimetypes.guess_type(name)[0] or "application/octet-stream"
        return name, bytes(value[1]), str(value[2]) if len(value) == 3 else guessed
    if isinstance(value, str | os.PathLike):
        path = Path(value)
        return path.name, path.read_bytes(), mimetypes.guess_type(path.name)[0] or "application/octet-stream"
    if isinstance(value, bytes | bytearray | memoryview):
        return "upload", bytes(value), "application/octet-stream"
    if hasattr(value, "read"):
        name = Path(str(getattr(value, "name", "upload"))).name
        return name, value.read(), mimetypes.guess_type(name)[0] or "application/octet-stream"
    if hasattr(value, "save"):  # a PIL image
        buffer = io.BytesIO()
        value.save(buffer, format="PNG")
        return "image.png", buffer.getvalue(), "image/png"
    raise TypeError(
        f"cannot upload a {type(value).__name__}: give a path, bytes, a binary file, a PIL image or (name, bytes)"
    )


def trace_headers(traceparent: str | None) -> dict[str, str]:
    """The trace a submit continues: ``traceparent`` when given, else the caller's current OpenTelemetry context
    when its process uses OpenTelemetry (the API package is optional here), else none."""
    if traceparent:
        return {"traceparent": traceparent}
    try:
        from opentelemetry.propagate import inject
    except ImportError:
        return {}
    carrier: dict[str, str] = {}
    inject(carrier)
    return carrier


def submit_call(model: str, options: dict[str, Any], wait_s: float = 0) -> Call:
    file, image, inputs = options.pop("file"), options.pop("image"), options.pop("inputs")
    if sum(value is not None for value in (file, image, inputs)) != 1:
        raise TypeError("submit takes exactly one of file=, image= or inputs=")
    headers = {"Idempotency-Key": options.pop("idempotency_key") or uuid.uuid4().hex}
    headers |= trace_headers(options.pop("traceparent", None))
    if wait_s > 0:
        headers["Prefer"] = f"wait={wait_s:g}"
    version = options.pop("version", None)  # pinned, else as the model's traffic shares route it
    chosen = {name: value for name, value in options.items() if value is not None}
    params = {"version": version} if version is not None else None
    call = Call("POST", f"/v1/models/{model}/jobs", params=params, headers=headers, timeout_s=wait_s or None)
    if inputs is not None:
        call.json = {"inputs": inputs, **chosen}
    else:
        call.files = {"file": upload(file if file is not None else image)}
        call.data = {name: str(value) for name, value in chosen.items()}
    return call


def jsonl(items: Any) -> bytes:
    """An upload's JSONL: a path's file as it is, or one line per item (a mapping as JSON, a str or bytes as is)."""
    if isinstance(items, str | os.PathLike):
        body = Path(items).read_bytes()
        return body if body.endswith(b"\n") or not body else body + b"\n"
    if isinstance(items, bytes | bytearray | Mapping):
        raise TypeError("give create_batch a path or an iterable of lines (mappings, or JSON text), not one item")
    lines = []
    for item in items:
        if isinstance(item, Mapping):
            lines.append(json.dumps(item, separators=(",", ":")).encode())
        elif isinstance(item, str):
            lines.append(item.encode())
        elif isinstance(item, bytes | bytearray):
            lines.append(bytes(item))
        else:
            raise TypeError(f"a batch line is a mapping, str or bytes, not a {type(item).__name__}")
    return b"".join(line.rstrip(b"\r\n") + b"\n" for line in lines)


def batch_call(model: str, items: Any, options: dict[str, Any]) -> Call:
    """The upload of a bulk batch: JSONL, its options as query parameters, always with an Idempotency-Key."""
    headers = {"Idempotency-Key": options.pop("idempotency_key") or uuid.uuid4().hex}
    headers["Content-Type"] = "application/jsonl"
    params = {name: value for name, value in options.items() if value is not None}
    return Call("POST", f"/v1/models/{model}/batches", params=params, headers=headers, content=jsonl(items))


def batch_path(batch_id: str, tail: str = "") -> str:
    return f"/v1/batches/{batch_id}{tail}"


def raise_for(response: httpx.Response) -> None:
    if response.status_code < 400:
        return
    code, message = "http_error", response.text[:300] or response.reason_phrase
    try:
        error = response.json()["error"]
        code, message = (error["code"], error["message"]) if isinstance(error, dict) else (code, str(error))
    except (ValueError, KeyError, TypeError):
        pass
    cls = error_class(code, response.status_code)
    wait = retry_after_s(response.headers.get("retry-after"))
    raise cls(message, status=response.status_code, code=code, retry_after_s=wait)


def finished(job: Job) -> Job:
    if job.status != "finished":
        raise JobFailed(job)
    return job


class SSE:
    """Server-Sent Events, line by line: each complete event's (name, data)."""

    def __init__(self) -> None:
        self.event, self.data = "message", []  # type: tuple[str, list[str]]

    def feed(self, line: str) -> tuple[str, str] | None:
        if not line:
            done = (self.event, "\n".join(self.data)) if self.data else None
            self.event, self.data = "message", []
            return done
        name, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if name == "event":
            self.event = value
        elif name == "data":
            self.data.append(value)
        return None


def retry_delay_s(
    retry: Retry, call: Call, attempt: int, outcome: httpx.Response | httpx.TransportError
) -> float | None:
    """Seconds before retrying ``call`` after try ``attempt`` ended in ``outcome``; None: do not retry."""
    if attempt >= retry.attempts:
        return None
    if isinstance(outcome, httpx.TransportError):
        unsent = isinstance(outcome, httpx.ConnectError | httpx.ConnectTimeout)
        return retry.delay_s(attempt) if call.repeatable or unsent else None
    if outcome.status_code not in (429, 503):
        return None
    return retry.delay_s(attempt, outcome.headers.get("retry-after"))


def wait_call(job_id: str, wait_s: float) -> Call:
    """Reading a job, long-polling up to ``wait_s`` seconds (0: answered at once)."""
    return Call("GET", f"/v1/jobs/{job_id}", params={"wait": f"{wait_s:.3f}"} if wait_s > 0 else None, timeout_s=wait_s)


def results_call(batch_id: str, offset: int) -> Call:
    # Never filtered by the API (?status=): the offset counts every line, so a read cut off resumes exactly.
    return Call("GET", batch_path(batch_id, "/results"), params={"offset": offset})


def events_timeout(timeout_s: float) -> httpx.Timeout:
    # The API sends a keep-alive comment every 15 s while the job runs.
    return httpx.Timeout(timeout_s, read=max(timeout_s, 30.0))


def events_path(job_id: str) -> str:
    return f"/v1/jobs/{job_id}/events"


def model_list(data: Mapping[str, Any]) -> ModelList:
    models = [Model.from_dict(model) for model in data.get("models", [])]
    return ModelList(models, [build(InvalidModel, item) for item in data.get("invalid", [])])
