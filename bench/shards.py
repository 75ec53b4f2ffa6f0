"""Past one Redis in `make bench`: two no-op models drained from two Redis servers against both from one.

One `inferq worker` process per model starts suspended (RQ's own switch) and loads its model; each queue is
filled; then the switch is lifted and the drain is timed from the first job's start to the last job's end as
Redis recorded them (so the workers' start-up, which loads torch, is left out). The two setups alternate, and
the best round of each counts. Every process's CPU time over the drain is read from /proc, so a ratio under the
target comes with where the cores went.

    python -m bench.shards [--jobs N] [--rounds R]
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from redis import Redis
from rq.suspension import resume, suspend

from bench.models import build_models
from bench.procs import Processes
from inferq.shared.jobs import QueueCache, Submission, enqueue_job
from inferq.shared.lifecycle import rqhash
from inferq.shared.redis_server import RedisServer
from inferq.shared.settings import Settings

log = logging.getLogger("bench")
MODELS = ("noop", "noopb")
_TICKS_S = os.sysconf("SC_CLK_TCK")


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process so far (0 once it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / _TICKS_S


def _fill(url: str, model: str, jobs: int) -> None:
    settings = Settings(redis_url=url, max_queue_length=jobs * 2)
    connection = Redis.from_url(url)
    queues = QueueCache(connection)
    body = json.dumps({"inputs": [0.0, 1.0, 2.0, 3.0]}).encode()
    for _ in range(jobs):
        enqueue_job(queues, settings, Submission(model, body, "application/json"))
    connection.close()


def _span(url: str) -> tuple[float, float, int]:
    """(first start, last end, jobs ended) over every job of a Redis, from RQ's own timestamps."""
    connection = Redis.from_url(url)
    ids = [key.decode().removeprefix("rq:job:") for key in connection.scan_iter("rq:job:*", count=5000)]
    with connection.pipeline(transaction=False) as pipe:
        for job_id in ids:
            pipe.hmget(f"rq:job:{job_id}", ["started_at", "ended_at", "status"])
        rows = pipe.execute()
    connection.close()
    starts = [rqhash.parse_stamp(r[0]) for r in rows if r[2] == b"finished"]
    ends = [rqhash.parse_stamp(r[1]) for r in rows if r[2] == b"finished"]
    first = min(s.timestamp() for s in starts if s is not None)
    last = max(e.timestamp() for e in ends if e is not None)
    return first, last, len(ends)


def _round(tmp: Path, models_dir: Path, servers: list[RedisServer], jobs: int, placement: dict[str, int]) -> dict:
    """One drain: each model's jobs on ``servers[placement[model]]``, one worker per model.

    The workers start suspended (RQ's own switch), so the queues are filled while they wait with their models
    loaded; the drain starts when the switch is lifted.
    """
    used = sorted(set(placement.values()))
    clients = {i: Redis.from_url(servers[i].url) for i in used}
    for server in servers:
        Redis.from_url(server.url).flushall()
    for client in clients.values():
        suspend(client)
    for model, index in placement.items():
        config = json.loads((models_dir / model / "config.json").read_text())
        config.pop("redis", None)
        if index:
            config["redis"] = f"s{index}"
        (models_dir / model / "config.json").write_text(json.dumps(config))
    procs = Processes(tmp, {"INFERQ_MODELS_DIR": str(models_dir), "INFERQ_REDIS_URL": servers[0].url})
    shards = {f"s{i}": s.url for i, s in enumerate(servers) if i > 0}
    procs.env["INFERQ_REDIS_SHARDS"] = ",".join(f"{name}={url}" for name, url in shards.items())
    try:
        workers = [procs.start(f"worker-{m}", "inferq", "worker", "--model", m) for m in placement]
        deadline = time.monotonic() + 120
        while sum(len(c.smembers("rq:workers")) for c in clients.values()) < len(placement):
            if time.monotonic() > deadline or any(w.poll() is not None for w in workers):
                raise RuntimeError(f"the bench's workers did not start; see {tmp}")
            time.sleep(0.05)
        for model, index in placement.items():
            _fill(servers[index].url, model, jobs)
        watched = {f"worker {m}": w.pid for m, w in zip(placement, workers, strict=True)}
        watched |= {f"redis {i}": servers[i].pid for i in used if servers[i].pid}
        before = {name: _cpu_s(pid) for name, pid in watched.items()}
        started = time.monotonic()
        for client in clients.values():
            resume(client)
        while sum(
            clients[index].zcard(f"rq:finished:inferq.{model}") for model, index in placement.items()
        ) < jobs * len(placement):
            if time.monotonic() - started > 600:
                raise RuntimeError(f"the bench's drain did not end; see {tmp}")
            time.sleep(0.02)
        used_s = {name: _cpu_s(pid) - before[name] for name, pid in watched.items()}
    finally:
        procs.stop()
    spans = [_span(servers[i].url) for i in used]
    first, last = min(s[0] for s in spans), max(s[1] for s in spans)
    ended = sum(s[2] for s in spans)
    seconds = last - first
    return {
        "jobs_per_s": ended / seconds,
        "seconds": seconds,
        "jobs": ended,
        # Cores each process used over the drain: its CPU seconds (idle while suspended) over the drain's span.
        "cpu_cores": {name: round(value / seconds, 2) for name, value in used_s.items()},
    }


def two_redis_vs_one(tmp: Path, noop_dir: Path, jobs: int, rounds: int) -> dict[str, Any]:
    """Two no-op models drained from one Redis, and from a Redis each, in alternating rounds: the best of each."""
    models_dir = tmp / "shard-models"
    models_dir.mkdir(parents=True, exist_ok=True)
    for model in MODELS:
        shutil.copytree(noop_dir, models_dir / model, dirs_exist_ok=True)
    servers = [RedisServer(tmp / f"redis-{i}", appendonly=False) for i in range(2)]
    for server in servers:
        server.start()
    one, two = [], []
    try:
        for round_ in range(rounds):
            one.append(_round(tmp, models_dir, servers, jobs, {m: 0 for m in MODELS}))
            two.append(_round(tmp, models_dir, servers, jobs, {m: i for i, m in enumerate(MODELS)}))
            log.info(
                "shards round %d: one Redis %.0f jobs/s, two %.0f jobs/s",
                round_,
                one[-1]["jobs_per_s"],
                two[-1]["jobs_per_s"],
            )
    finally:
        for server in servers:
            server.stop()
    best_one = max(one, key=lambda r: r["jobs_per_s"])
    best_two = max(two, key=lambda r: r["jobs_per_s"])
    return {
        "one_redis": best_one,
        "two_redis": best_two,
        "ratio": best_two["jobs_per_s"] / best_one["jobs_per_s"],
        "jobs_per_model": jobs,
        "cpus": os.cpu_count(),
        "rounds": {"one": [r["jobs_per_s"] for r in one], "two": [r["jobs_per_s"] for r in two]},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=10000, help="jobs per model")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    tmp = Path(tempfile.mkdtemp(prefix="inferq-shards-"))
    models = build_models(tmp / "models")
    print(json.dumps(two_redis_vs_one(tmp, models["noop"], args.jobs, args.rounds), indent=2))
    subprocess.run(["rm", "-rf", str(tmp)], check=False)


if __name__ == "__main__":
    main()
