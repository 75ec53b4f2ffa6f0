"""Tenants' fair share (docs/tenants.md), measured: what it costs the drain, and what it spares a small tenant.

1. **Drain.** The same queue of no-op jobs drained by one worker, queued by one tenant (fairness off: the plain
   tail) and by two alternating tenants in weighted fair order, in alternating rounds; the best round of each.
2. **A small tenant beside a backlog.** A worker serves the no-op model; tenant B queues 5 jobs a second. B's p99
   queue time (queued to started, as its job views say) alone, then while tenant A's 10,000 jobs are queued at
   once, with fairness on and, for contrast, off (one FIFO, as before tenants). The target: beside the backlog with
   fairness on, B's p99 within one batch time + 20 ms of alone.

Run alone: ``python -m bench.fairness`` (``--quick`` for a short pass).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from redis import Redis

from bench.models import build_models
from inferq.shared.jobs import TERMINAL, QueueCache, Submission, _new_job, enqueue_job, get_job_view
from inferq.shared.lifecycle import submit
from inferq.shared.models import load_model_config
from inferq.shared.redis_server import RedisServer
from inferq.shared.settings import Settings

log = logging.getLogger(__name__)

B_PER_S = 5.0
BACKLOG = 10_000


def payloads_for(model: str, count: int) -> tuple[list[bytes], str]:
    from bench.run import payloads_for as inputs  # bench.run runs this module's rows

    return inputs(model, count)


def _fill(connection: Redis, settings: Settings, jobs: int, tenants: list[str], fair: bool) -> list[str]:
    payloads, content_type = payloads_for("noop", 1)
    payload = payloads[0]
    queues = QueueCache(connection)
    return [
        enqueue_job(
            queues,
            settings,
            Submission("noop", payload, content_type, tenant=tenants[i % len(tenants)], fair=fair),
        ).id
        for i in range(jobs)
    ]


def drain_with_and_without(redis_url: str, model_dir: Path, jobs: int, rounds: int) -> dict[str, Any]:
    """Jobs already queued, drained by one worker: by one tenant at the tail, and by two in fair order."""
    from bench.run import _worker

    connection = Redis.from_url(redis_url)
    settings = Settings(redis_url=redis_url, max_queue_length=max(jobs, 10_000))
    rates: dict[str, list[float]] = {"off": [], "on": []}
    submit_us: dict[str, list[float]] = {"off": [], "on": []}
    for round_ in range(rounds):
        sides = [("off", ["one"]), ("on", ["a", "b"])]
        # Which side goes first alternates too: the second drain of a round ran slower on either side (measured).
        for side, tenants in sides if round_ % 2 == 0 else sides[::-1]:
            connection.flushall()
            started = time.perf_counter()
            _fill(connection, settings, jobs, tenants, fair=side == "on")
            submit_us[side].append((time.perf_counter() - started) / jobs * 1e6)
            worker = _worker(connection, settings, model_dir, "cpu", f"bench-fair-{side}-{os.getpid()}-{round_}")
            started = time.perf_counter()
            worker.work(burst=True, logging_level="WARNING")
            rates[side].append(jobs / (time.perf_counter() - started))
        log.info("fairness drain round %d: off %.0f, on %.0f jobs/s", round_, rates["off"][-1], rates["on"][-1])
    connection.flushall()
    connection.close()
    return {
        "off_jobs_per_s": max(rates["off"]),
        "on_jobs_per_s": max(rates["on"]),
        "ratio": max(rates["on"]) / max(rates["off"]),
        "submit_us": {side: min(values) for side, values in submit_us.items()},
        "jobs": jobs,
        "rounds": rates,
    }


def _queued_s(view: dict[str, Any]) -> float:
    return float(view["timings_ms"]["queue_ms"]) / 1000


def _p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]


def _backlog(connection: Redis, settings: Settings, model: str, jobs: int, fair: bool) -> None:
    """Tenant A's ``jobs`` queued at once: the submit script's calls pipelined, 500 a round trip."""
    payloads, content_type = payloads_for(model, 8)
    for start in range(0, jobs, 500):
        with connection.pipeline(transaction=False) as pipe:
            for i in range(start, min(start + 500, jobs)):
                submission = Submission(model, payloads[i % 8], content_type, tenant="a", fair=fair)
                submit.queue_enqueue(pipe, _new_job(settings, submission))
            pipe.execute()


def _small_tenant(connection: Redis, settings: Settings, model: str, backlog: int, fair: bool, samples: int) -> dict:
    """B's queue times at B_PER_S, alone (``backlog`` 0) or while tenant A's ``backlog``, queued at once, waits:
    rounds until ``samples`` of B's jobs were queued while A's still waited."""
    payloads, content_type = payloads_for(model, 8)
    queues = QueueCache(connection)
    queue = f"rq:queue:inferq.{model}"
    ids: list[str] = []
    while len(ids) < samples:
        if backlog:
            _backlog(connection, settings, model, backlog, fair)
        while len(ids) < samples and (not backlog or connection.llen(queue) > backlog // 10):
            submission = Submission(model, payloads[len(ids) % 8], content_type, tenant="b", fair=fair)
            ids.append(enqueue_job(queues, settings, submission).id)
            time.sleep(1 / B_PER_S)
        deadline = time.monotonic() + 300
        while connection.llen(queue) and time.monotonic() < deadline:
            time.sleep(0.05)  # A's backlog drains before the next round
    deadline = time.monotonic() + 60
    views = [get_job_view(connection, i) for i in ids]
    while any(v["status"] not in TERMINAL for v in views) and time.monotonic() < deadline:
        time.sleep(0.2)
        views = [get_job_view(connection, i) for i in ids]
    if {v["status"] for v in views} != {"finished"}:
        raise RuntimeError(f"tenant B's jobs did not all finish: {[v.get('error') or v['status'] for v in views][:5]}")
    queued = [_queued_s(v) for v in views]
    return {"p99_ms": _p99(queued) * 1000, "p50_ms": sorted(queued)[len(queued) // 2] * 1000, "samples": len(queued)}


def small_tenant_beside_backlog(redis_url: str, models_dir: Path, samples: int) -> dict[str, Any]:
    """A worker process serving the digits model; B's queue times alone, beside A's backlog fair and not."""
    model = "digits"
    settings = Settings(redis_url=redis_url, max_queue_length=BACKLOG * 2)
    connection = Redis.from_url(redis_url)
    connection.flushall()
    root = str(Path(__file__).resolve().parent.parent)
    env = {**os.environ, "INFERQ_REDIS_URL": redis_url, "INFERQ_MODELS_DIR": str(models_dir), "PYTHONPATH": root}
    log_path = models_dir.parent / "fairness-worker.log"
    with log_path.open("wb") as log_file:
        worker = subprocess.Popen(
            [sys.executable, "-m", "inferq", "worker", "--model", model, "--name", f"bench-fair-{os.getpid()}"],
            env=env,
            stdout=log_file,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + 60
        while not connection.smembers(f"rq:workers:inferq.{model}") and time.monotonic() < deadline:
            if worker.poll() is not None:
                raise RuntimeError(f"the fairness bench's worker ended: {log_path.read_text()[-2000:]}")
            time.sleep(0.1)
        started = time.perf_counter()
        _backlog(connection, settings, model, BACKLOG, False)
        while connection.llen(f"rq:queue:inferq.{model}"):
            time.sleep(0.01)
        drain_per_s = BACKLOG / (time.perf_counter() - started)
        alone = _small_tenant(connection, settings, model, 0, True, samples)
        fair = _small_tenant(connection, settings, model, BACKLOG, True, samples)
        fifo = _small_tenant(connection, settings, model, BACKLOG, False, max(5, samples // 4))
    finally:
        worker.terminate()
        worker.wait(timeout=30)
        connection.flushall()
        connection.close()
    max_batch = load_model_config(models_dir / model).max_batch
    return {
        "model": model,
        "backlog": BACKLOG,
        "b_per_s": B_PER_S,
        "alone": alone,
        "beside_backlog_fair": fair,
        "beside_backlog_fifo": fifo,
        "max_batch": max_batch,
        # One batch's time as this worker drains a backlog: its max batch at its drain rate.
        "batch_ms": 1000 * max_batch / drain_per_s,
        "drain_per_s": drain_per_s,
    }


def fairness(redis_url: str, models_dir: Path, quick: bool) -> dict[str, Any]:
    """Both measures."""
    out = drain_with_and_without(redis_url, models_dir / "noop", 2000 if quick else 10_000, 1 if quick else 4)
    out["small_tenant"] = small_tenant_beside_backlog(redis_url, models_dir, 10 if quick else 40)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    tmp = Path(tempfile.mkdtemp(prefix="inferq-fairness-"))
    build_models(tmp / "models")
    server = RedisServer(tmp / "redis", appendonly=False)
    server.start()
    try:
        print(json.dumps(fairness(server.url, tmp / "models", args.quick), indent=2))
    finally:
        server.stop()
        subprocess.run(["rm", "-rf", str(tmp)], check=False)


if __name__ == "__main__":
    main()
