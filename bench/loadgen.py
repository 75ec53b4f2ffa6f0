"""The asyncio load generator as a process of its own: ``python -m bench.loadgen MODE SPEC``.

MODE ``fixed``: one request repeated by N connections (hey's job, for machines without hey or wrk);
prints a ``bench.generators.LoadResult`` as JSON. MODE ``closed`` / ``open``: ``bench.load``'s closed
or open loop with a call of ``bench.load.CALLS``; prints the load point's summary as JSON.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import aiohttp

from bench.generators import LoadResult
from bench.load import CALLS, closed_loop, open_loop, pct


async def fixed(spec: dict[str, Any]) -> LoadResult:
    body = Path(spec["body"]).read_bytes() if spec.get("body") else None
    clients, duration_s = int(spec["clients"]), float(spec["duration_s"])
    latencies: list[float] = []
    statuses: dict[str, int] = {}
    errors: dict[str, int] = {}
    connector = aiohttp.TCPConnector(limit=clients)
    timeout = aiohttp.ClientTimeout(total=float(spec["timeout_s"]))
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        deadline = time.perf_counter() + duration_s

        async def loop() -> None:
            while time.perf_counter() < deadline:
                started = time.perf_counter()
                try:
                    async with session.request(
                        spec["method"], spec["url"], data=body, headers=spec["headers"]
                    ) as response:
                        await response.read()
                        code = str(response.status)
                    statuses[code] = statuses.get(code, 0) + 1
                    if code.startswith("2"):
                        latencies.append((time.perf_counter() - started) * 1000)
                except (TimeoutError, aiohttp.ClientError) as exc:
                    name = type(exc).__name__
                    errors[name] = errors.get(name, 0) + 1

        started = time.perf_counter()
        await asyncio.gather(*(loop() for _ in range(clients)))
        elapsed = time.perf_counter() - started
    latencies.sort()
    ok = sum(n for code, n in statuses.items() if code.startswith("2"))
    failed = sum(statuses.values()) - ok + sum(errors.values())
    return LoadResult(
        "python",
        clients,
        elapsed,
        ok,
        failed,
        pct(latencies, 50),
        pct(latencies, 90),
        pct(latencies, 99),
        statuses,
        errors,
    )


def main() -> None:
    mode, spec = sys.argv[1], json.loads(sys.argv[2])
    if mode == "fixed":
        print(json.dumps(asdict(asyncio.run(fixed(spec)))))
        return
    payloads = [Path(p).read_bytes() for p in spec["payloads"]]
    call = CALLS[spec["call"]](*spec["call_args"])
    if mode == "closed":
        stats = asyncio.run(closed_loop(call, payloads, int(spec["clients"]), spec["duration_s"], spec["label"]))
    elif mode == "open":
        stats = asyncio.run(open_loop(call, payloads, float(spec["rate"]), spec["duration_s"], spec["label"]))
    else:
        raise SystemExit(f"unknown mode {mode!r}")
    stats.calls_per_item = 2 if spec["call"] == "submit_then_wait" else 1
    print(json.dumps(stats.summary()))


if __name__ == "__main__":
    main()
