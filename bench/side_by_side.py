"""`python -m bench.side_by_side BEFORE AFTER`: two checkouts of inferq measured side by side, alternated rounds.

Each checkout runs its own API process and its own no-op worker on one shared redis-server (each version's jobs on
its own port and queue names are the same, so the rounds never overlap: one version runs at a time). The rows
issue 27 holds a renovation to: the submit path (digit PNG submits, worker stopped, wrk or hey at 64
connections), many waiting clients (`Prefer: wait` no-op submits at 256 and 1,024 clients) and the drain (each
checkout's own `make bench` drain: no-op jobs queued beforehand, one worker in process). Rounds alternate
BEFORE, AFTER, BEFORE, AFTER…, so a burst of someone else's work lands on a round, not on one side; the best
round of each side counts. Prints a markdown table; writes the rounds as JSON with ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from redis import Redis

from bench.generators import hammer, pick_tool
from bench.models import NoOp
from bench.procs import Processes, wait_http
from inferq.shared.redis_server import RedisServer, free_port
from inferq.workers.formats import save_export

ROOT = Path(__file__).resolve().parent.parent
WAITING = (256, 1024)


def models(target: Path) -> Path:
    """The no-op model and the digits demo's config (a submit only checks the PNG against it)."""
    noop = target / "noop"
    noop.mkdir(parents=True)
    save_export(NoOp(), torch.zeros(2, 4), noop / "model.pt2")
    config = {"handler": "tensor", "format": "export", "weights": "model.pt2", "max_batch": 256}
    config["input"] = {"kind": "tensor", "shape": [4], "dtype": "float32"}
    (noop / "config.json").write_text(json.dumps(config))
    shutil.copytree(ROOT / "models" / "digits", target / "digits")
    return target


class Version:
    """One checkout's API and worker, started and stopped around its rounds."""

    def __init__(self, label: str, checkout: Path, redis_url: str, models_dir: Path, logs: Path) -> None:
        self.label = label
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        env = {
            "INFERQ_REDIS_URL": redis_url,
            "INFERQ_MODELS_DIR": str(models_dir),
            "INFERQ_RESULT_TTL_S": "30",
            "INFERQ_FAILURE_TTL_S": "30",
            "INFERQ_JOB_TIMEOUT_S": "30",
            "INFERQ_MAX_QUEUE_LENGTH": "100000000",
            "INFERQ_QUEUE_TTL_S": "600",
        }
        self.procs = Processes(logs, env, cwd=checkout)

    def start(self, worker: bool) -> None:
        self.procs.start(f"{self.label}-api", "inferq", "--log-level", "WARNING", "api", "--port", str(self.port))
        if worker:
            self.procs.start(f"{self.label}-worker", "inferq", "--log-level", "WARNING", "worker", "--model", "noop")
        wait_http(f"{self.base}/readyz")
        time.sleep(3 if worker else 1)

    def stop(self) -> None:
        self.procs.stop()


def submits(version: Version, seconds: float, tool: str) -> dict[str, Any]:
    png = _digit_png()
    url = f"{version.base}/v1/models/digits/jobs"
    return hammer(url, 64, seconds, tool=tool, method="POST", body=png, headers={"content-type": "image/png"}).summary()


def waiting(version: Version, clients: int, seconds: float, tool: str) -> dict[str, Any]:
    body = json.dumps({"inputs": [1.0, 2.0, 3.0, 4.0]}).encode()
    headers = {"content-type": "application/json", "prefer": "wait=60"}
    url = f"{version.base}/v1/models/noop/jobs"
    return hammer(
        url, clients, max(seconds, clients / 32), tool=tool, method="POST", body=body, headers=headers
    ).summary()


# Run in a checkout (its cwd first on the path): that checkout's own ``bench.run.drain``, one round, its worker in
# process, as `make bench` measures the drain. RQ's share of the round is kept small: only inferq's rate is read.
_DRAIN = """
import json, sys
from pathlib import Path
from bench.run import drain
print(json.dumps(drain(sys.argv[1], Path(sys.argv[2]), int(sys.argv[3]), 200, rounds=1)))
"""


def drains(version: Version, redis_url: str, models_dir: Path, jobs: int) -> float:
    """Jobs per second one in-process worker of this checkout drains from a queue of ``jobs`` no-op jobs."""
    done = subprocess.run(
        [sys.executable, "-c", _DRAIN, redis_url, str(models_dir / "noop"), str(jobs)],
        cwd=version.procs.cwd,
        env={**os.environ, "PYTHONPATH": str(version.procs.cwd)},
        capture_output=True,
        text=True,
        timeout=600,
    )
    if done.returncode != 0:
        raise RuntimeError(f"the drain in {version.procs.cwd} failed: {done.stderr[-2000:]}")
    return float(json.loads(done.stdout.strip().splitlines()[-1])["inferq_jobs_per_s"])


def _digit_png() -> bytes:
    from bench.run import payloads_for

    return payloads_for("digits", 1)[0][0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("before", type=Path, help="the checkout measured first in every round")
    parser.add_argument("after", type=Path)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=6.0)
    parser.add_argument("--drain-jobs", type=int, default=8_000, help="no-op jobs per drain round (0: no drain)")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    tool = pick_tool()
    tmp = Path(tempfile.mkdtemp(prefix="inferq-sbs-"))
    redis = RedisServer(tmp / "redis", appendonly=False)
    redis.start()
    models_dir = models(tmp / "models")
    versions = [
        Version(label, path.resolve(), redis.url, models_dir, tmp)
        for label, path in (("before", args.before), ("after", args.after))
    ]
    rounds: dict[str, dict[str, list[float]]] = {v.label: {} for v in versions}
    try:
        for _ in range(args.rounds):
            for version in versions:
                rows = rounds[version.label]
                version.start(worker=False)
                rows.setdefault("submits", []).append(submits(version, args.seconds, tool)["per_s"])
                version.stop()
                Redis.from_url(redis.url).flushall()
                version.start(worker=True)
                for clients in WAITING:
                    point = waiting(version, clients, args.seconds, tool)
                    rows.setdefault(f"waiting {clients}", []).append(point["per_s"])
                    rows.setdefault(f"waiting {clients} failed", []).append(point["failed"])
                version.stop()
                Redis.from_url(redis.url).flushall()
                if args.drain_jobs:
                    rows.setdefault("drain", []).append(drains(version, redis.url, models_dir, args.drain_jobs))
                print(version.label, {k: v[-1] for k, v in rows.items()}, flush=True)
    finally:
        for version in versions:
            version.stop()
        redis.stop()
    lines = [
        f"| row ({tool}, best of {args.rounds} alternated rounds) | before | after | after / before |",
        "|---|---|---|---|",
    ]
    for row in rounds["before"]:
        if row.endswith("failed"):
            lines.append(
                f"| {row} (all rounds) | {sum(rounds['before'][row]):.0f} | {sum(rounds['after'][row]):.0f} | |"
            )
            continue
        before, after = max(rounds["before"][row]), max(rounds["after"][row])
        lines.append(f"| {row} (/s) | {before:,.0f} | {after:,.0f} | {after / before:.2f}× |")
    print("\n".join(lines))
    if args.out:
        args.out.write_text(json.dumps(rounds, indent=2))
    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
