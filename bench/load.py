"""The asyncio load generator: closed loop (N clients, each submit then wait) and open loop (Poisson
arrivals), with aiohttp. It always runs in a process of its own (``bench.loadgen``), never in the
bench's process, and its ceiling is measured alongside (``bench.generators``).
"""

from __future__ import annotations

import asyncio
import random
import statistics
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp

# One request's outcome: what the server said of the job.
Call = Callable[[aiohttp.ClientSession, bytes], Awaitable[dict[str, Any]]]


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
    calls_per_item: int = 1

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
            "p50_ms": pct(lat, 50),
            "p95_ms": pct(lat, 95),
            "p99_ms": pct(lat, 99),
            "mean_batch": statistics.fmean(batches) if batches else None,
            "queue_ms_mean": statistics.fmean(queue) if queue else None,
            "inference_ms_mean": statistics.fmean(infer) if infer else None,
            "calls_per_item": self.calls_per_item,
        }


def pct(sorted_values: list[float], percent: float) -> float | None:
    if not sorted_values:
        return None
    index = min(len(sorted_values) - 1, max(0, round(percent / 100 * len(sorted_values) + 0.5) - 1))
    return sorted_values[index]


def bare_get(base: str, path: str) -> Call:
    """A bare route (``/healthz``): the generator's own ceiling."""

    async def call(client: aiohttp.ClientSession, payload: bytes) -> dict[str, Any]:
        async with client.get(f"{base}{path}") as response:
            await response.read()
            return {"status": "finished" if response.status == 200 else "error"}

    return call


def submit_prefer_wait(base: str, submit_path: str, content_type: str) -> Call:
    """inferq's one-call form: POST with ``Prefer: wait=60`` answers with the finished job."""

    async def call(client: aiohttp.ClientSession, payload: bytes) -> dict[str, Any]:
        headers = {"content-type": content_type, "prefer": "wait=60"}
        async with client.post(f"{base}{submit_path}", data=payload, headers=headers) as response:
            return dict(await response.json(content_type=None))

    return call


def submit_then_wait(base: str, submit_path: str, content_type: str, job_path: str) -> Call:
    """POST the payload, then GET the job with ?wait= until it ends: the same two calls for every system."""

    async def call(client: aiohttp.ClientSession, payload: bytes) -> dict[str, Any]:
        headers = {"content-type": content_type}
        async with client.post(f"{base}{submit_path}", data=payload, headers=headers) as response:
            body = await response.json(content_type=None)
            status = response.status
        if status == 200 and body.get("status") == "finished":
            return dict(body)  # a synchronous server answers in the submit
        if status != 202:
            return {"status": "error", "error": body}
        async with client.get(f"{base}{job_path.format(id=body['id'])}", params={"wait": "60"}) as job:
            return dict(await job.json(content_type=None))

    return call


CALLS: dict[str, Callable[..., Call]] = {
    "bare_get": bare_get,
    "prefer_wait": submit_prefer_wait,
    "submit_then_wait": submit_then_wait,
}


async def _one(client: aiohttp.ClientSession, call: Call, payload: bytes, stats: Stats) -> None:
    started = time.perf_counter()
    try:
        body = await call(client, payload)
        ok = body.get("status") == "finished"
    except (TimeoutError, aiohttp.ClientError, ValueError, KeyError):
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


def _session(connections: int) -> aiohttp.ClientSession:
    connector = aiohttp.TCPConnector(limit=connections, force_close=False)
    return aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=120))


async def closed_loop(call: Call, payloads: list[bytes], clients: int, duration_s: float, label: str) -> Stats:
    """``clients`` loops, each sending its next request as soon as the last one ended."""
    stats = Stats(label, clients, duration_s)
    async with _session(clients + 4) as client:
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
    async with _session(512) as client:
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
