"""Load generators: closed loop (N clients, each submit then wait) and open loop (Poisson arrivals)."""

from __future__ import annotations

import asyncio
import random
import statistics
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import httpx

# One request's outcome: seconds from submit to result, and what the server said of the job.
Call = Callable[[httpx.AsyncClient, bytes], Awaitable[dict[str, Any]]]


@dataclass
class Sample:
    latency_s: float
    ok: bool
    batch_size: int | None = None
    queue_ms: float | None = None
    inference_ms: float | None = None


@dataclass
class Stats:
    """What one load point measured."""

    label: str
    offered: float
    duration_s: float
    samples: list[Sample] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        ok = [s for s in self.samples if s.ok]
        lat = sorted(s.latency_s * 1000 for s in ok)
        batches = [s.batch_size for s in ok if s.batch_size]
        queue = [s.queue_ms for s in ok if s.queue_ms is not None]
        infer = [s.inference_ms for s in ok if s.inference_ms is not None]
        return {
            "label": self.label,
            "offered": self.offered,
            "completed": len(ok),
            "errors": len(self.samples) - len(ok),
            "throughput_per_s": len(ok) / self.duration_s if self.duration_s else 0.0,
            "p50_ms": _pct(lat, 50),
            "p95_ms": _pct(lat, 95),
            "p99_ms": _pct(lat, 99),
            "mean_batch": statistics.fmean(batches) if batches else None,
            "queue_ms_mean": statistics.fmean(queue) if queue else None,
            "inference_ms_mean": statistics.fmean(infer) if infer else None,
        }


def _pct(sorted_values: list[float], pct: float) -> float | None:
    if not sorted_values:
        return None
    index = min(len(sorted_values) - 1, max(0, round(pct / 100 * len(sorted_values) + 0.5) - 1))
    return sorted_values[index]


def submit_prefer_wait(base: str, submit_path: str, content_type: str) -> Call:
    """inferq's one-call form: POST with ``Prefer: wait=60`` answers with the finished job."""

    async def call(client: httpx.AsyncClient, payload: bytes) -> dict[str, Any]:
        headers = {"content-type": content_type, "prefer": "wait=60"}
        response = await client.post(f"{base}{submit_path}", content=payload, headers=headers)
        return dict(response.json())

    return call


def submit_then_wait(base: str, submit_path: str, content_type: str, job_path: str) -> Call:
    """POST the payload, then GET the job with ?wait= until it ends: the same two calls for every system."""

    async def call(client: httpx.AsyncClient, payload: bytes) -> dict[str, Any]:
        response = await client.post(f"{base}{submit_path}", content=payload, headers={"content-type": content_type})
        body = response.json()
        if response.status_code == 200 and body.get("status") == "finished":
            return body  # a synchronous server answers in the submit
        if response.status_code != 202:
            return {"status": "error", "error": body}
        job = await client.get(f"{base}{job_path.format(id=body['id'])}", params={"wait": 60})
        return dict(job.json())

    return call


async def _one(client: httpx.AsyncClient, call: Call, payload: bytes, stats: Stats) -> None:
    started = time.perf_counter()
    try:
        body = await call(client, payload)
        ok = body.get("status") == "finished"
    except (httpx.HTTPError, ValueError):
        body, ok = {}, False
    timings = body.get("timings_ms") or {}
    stats.samples.append(
        Sample(
            time.perf_counter() - started,
            ok,
            body.get("batch_size"),
            timings.get("queue_ms"),
            timings.get("inference_ms"),
        )
    )


async def closed_loop(call: Call, payloads: list[bytes], clients: int, duration_s: float, label: str) -> Stats:
    """``clients`` loops, each sending its next request as soon as the last one ended."""
    stats = Stats(label, clients, duration_s)
    limits = httpx.Limits(max_connections=clients + 4, max_keepalive_connections=clients + 4)
    async with httpx.AsyncClient(timeout=120, limits=limits) as client:
        await _one(client, call, payloads[0], Stats("warmup", 0, 0))
        deadline = time.perf_counter() + duration_s

        async def loop(worker: int) -> None:
            i = worker
            while time.perf_counter() < deadline:
                await _one(client, call, payloads[i % len(payloads)], stats)
                i += clients

        started = time.perf_counter()
        await asyncio.gather(*(loop(w) for w in range(clients)))
        stats.duration_s = time.perf_counter() - started
    return stats


async def open_loop(call: Call, payloads: list[bytes], rate_per_s: float, duration_s: float, label: str) -> Stats:
    """Poisson arrivals at ``rate_per_s`` for ``duration_s``, whatever the server's pace."""
    stats = Stats(label, rate_per_s, duration_s)
    rng = random.Random(1)
    async with httpx.AsyncClient(timeout=120, limits=httpx.Limits(max_connections=512)) as client:
        await _one(client, call, payloads[0], Stats("warmup", 0, 0))
        tasks = []
        started = time.perf_counter()
        next_at = started
        i = 0
        while next_at < started + duration_s:
            await asyncio.sleep(max(0.0, next_at - time.perf_counter()))
            tasks.append(asyncio.create_task(_one(client, call, payloads[i % len(payloads)], stats)))
            i += 1
            next_at += rng.expovariate(rate_per_s)
        await asyncio.gather(*tasks)
        stats.duration_s = time.perf_counter() - started
    return stats
