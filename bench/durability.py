"""INFERQ_DURABILITY in `make bench`: the submit path with `replica` (a WAIT per pipelined batch: group commit)
against `async`, both API processes on one primary with one replica, measured in alternating rounds."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Protocol, cast

from redis import Redis

from bench.procs import Processes, wait_http
from inferq.shared.redis_server import RedisServer, free_port

MODES = ("async", "replica")


class Submitter(Protocol):
    """What the bench's load generator offers this row (bench.run.Bench)."""

    tmp: Path
    redis: RedisServer

    def _env(self) -> dict[str, str]: ...

    def _submits(self, base: str, duration_s: float | None = None) -> dict[str, Any]: ...


def replica_vs_async(bench: Submitter, rounds: int, warm_up_s: float) -> dict[str, Any]:
    """Digit submits per second through an API with INFERQ_DURABILITY=replica against one with async."""
    replica = RedisServer(
        bench.tmp / "redis-replica", appendonly=False, options=("--replicaof", "127.0.0.1", str(bench.redis.port))
    )
    replica.start()
    primary = Redis.from_url(bench.redis.url)
    env = {**bench._env(), "INFERQ_MAX_QUEUE_LENGTH": "100000000", "INFERQ_QUEUE_TTL_S": "600"}
    procs = Processes(bench.tmp, env)
    bases: dict[str, str] = {}
    measured: dict[str, list[float]] = {mode: [] for mode in MODES}
    try:
        deadline = time.monotonic() + 30
        while int(cast(dict[str, Any], primary.info("replication")).get("connected_slaves", 0)) < 1:
            if time.monotonic() > deadline:
                raise RuntimeError("the bench's replica did not connect")
            time.sleep(0.05)
        for mode in MODES:
            port = free_port()
            procs.start(
                f"inferq-api-{mode}",
                "inferq",
                "--log-level",
                "WARNING",
                "api",
                "--port",
                str(port),
                env={"INFERQ_DURABILITY": mode},
            )
            bases[mode] = f"http://127.0.0.1:{port}"
        for base in bases.values():
            wait_http(f"{base}/readyz")
            bench._submits(base, warm_up_s)
        for _ in range(rounds):
            for mode, base in bases.items():
                primary.flushall()
                result = bench._submits(base)
                if result["failed"]:
                    raise RuntimeError(f"{result['failed']} submits failed with INFERQ_DURABILITY={mode}")
                measured[mode].append(result["per_s"])
    finally:
        procs.stop()
        replica.stop()
        primary.flushall()
        primary.close()
    best = {mode: max(rates) for mode, rates in measured.items()}
    return {
        "async_per_s": best["async"],
        "replica_per_s": best["replica"],
        "ratio": best["replica"] / best["async"],
        "rounds": measured,
    }
