"""`python -m bench.tracing`: what traces cost (docs/tracing.md), tracing off against on, in one run.

Two rows, each alternated off, on, on, off… with the best round of each side counting:

- the submit path: CPU time of one API process per digit-PNG submit (worker stopped, 16 clients), read from the
  process's own clock ticks, so a burst of someone else's work on the machine does not move it as it moves a rate;
- the drain: no-op jobs queued beforehand, drained by one worker in a process of its own (``bench.run.drain``).

"On" exports to a local OTLP/HTTP sink that answers every export at once (what a collector next to the service
does); "off" has no endpoint, so the SDK is never loaded. Off against the code before tracing existed is
``python -m bench.side_by_side BEFORE AFTER``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
from redis import Redis

from bench.side_by_side import _digit_png, models
from inferq.shared.redis_server import RedisServer, free_port

ROOT = Path(__file__).resolve().parent.parent
SUBMITS = 4000
_DRAIN = """
import json, sys
from pathlib import Path
from inferq.shared import tracing
tracing.setup("worker")
from bench.run import drain
print(json.dumps(drain(sys.argv[1], Path(sys.argv[2]), int(sys.argv[3]), 50, rounds=1)))
tracing.shutdown()
"""


class Sink:
    """An OTLP/HTTP endpoint that takes every export and counts the bytes."""

    def __init__(self) -> None:
        self.bytes = 0
        sink = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                sink.bytes += len(self.rfile.read(int(self.headers.get("Content-Length", "0"))))
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", free_port()), Handler)
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _env(redis_url: str, models_dir: Path, endpoint: str | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "INFERQ_"))}
    env |= {"INFERQ_REDIS_URL": redis_url, "INFERQ_MODELS_DIR": str(models_dir), "PYTHONPATH": str(ROOT)}
    if endpoint:
        env["OTEL_EXPORTER_OTLP_ENDPOINT"] = endpoint
    return env


def _ticks(pid: int) -> int:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])  # utime + stime


def submit_cpu_us(redis_url: str, models_dir: Path, endpoint: str | None, body: Path) -> float:
    """One API process's CPU microseconds per digit-PNG submit (hey, 16 clients; 500 to warm up)."""
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    command = [sys.executable, "-m", "inferq", "--log-level", "WARNING", "api", "--port", str(port)]
    api = subprocess.Popen(command, cwd=ROOT, env=_env(redis_url, models_dir, endpoint))
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{base}/readyz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.1)
        hey = ["-c", "16", "-m", "POST", "-T", "image/png", "-D", str(body), f"{base}/v1/models/digits/jobs"]
        subprocess.run(["hey", "-n", "500", *hey], capture_output=True, check=True)
        before = _ticks(api.pid)
        out = subprocess.run(["hey", "-n", str(SUBMITS), *hey], capture_output=True, text=True, check=True).stdout
        used = _ticks(api.pid) - before
        if f"[202]\t{SUBMITS} responses" not in out:
            raise RuntimeError(f"not every submit was accepted: {out[-800:]}")
        return used * (1e6 / os.sysconf("SC_CLK_TCK")) / SUBMITS
    finally:
        api.terminate()
        api.wait(30)
        Redis.from_url(redis_url).flushall()


def drain_rate(redis_url: str, models_dir: Path, endpoint: str | None, jobs: int) -> float:
    """No-op jobs per second one worker drains, in a process of its own."""
    done = subprocess.run(
        [sys.executable, "-c", _DRAIN, redis_url, str(models_dir / "noop"), str(jobs)],
        cwd=ROOT,
        env=_env(redis_url, models_dir, endpoint),
        capture_output=True,
        text=True,
        timeout=600,
    )
    if done.returncode != 0:
        raise RuntimeError(f"the drain failed: {done.stderr[-2000:]}")
    return float(json.loads(done.stdout.strip().splitlines()[-1])["inferq_jobs_per_s"])


def tracing_cost(redis_url: str, target: Path, rounds: int = 3, drain_jobs: int = 8000) -> dict[str, Any]:
    """Best-of-``rounds`` submit CPU and drain rate, tracing off and on, alternated."""
    models_dir = models(target / "tracing-models")
    body = target / "digit.png"
    body.write_bytes(_digit_png())
    sink = Sink()
    found: dict[str, dict[str, list[float]]] = {side: {"submit_us": [], "drain": []} for side in ("off", "on")}
    try:
        for round_ in range(rounds):
            order = ("off", "on") if round_ % 2 == 0 else ("on", "off")
            for side in order:
                endpoint = sink.endpoint if side == "on" else None
                found[side]["submit_us"].append(submit_cpu_us(redis_url, models_dir, endpoint, body))
            for side in reversed(order):
                endpoint = sink.endpoint if side == "on" else None
                found[side]["drain"].append(drain_rate(redis_url, models_dir, endpoint, drain_jobs))
    finally:
        sink.close()
    off, on = found["off"], found["on"]
    return {
        "rounds": found,
        "submit_us_off": min(off["submit_us"]),
        "submit_us_on": min(on["submit_us"]),
        "drain_off": max(off["drain"]),
        "drain_on": max(on["drain"]),
        "exported_bytes": sink.bytes,
    }


def table(result: dict[str, Any]) -> str:
    rows = [
        "| row (best of alternated rounds) | tracing off | tracing on | on / off |",
        "|---|---|---|---|",
        f"| API CPU per digit submit (µs) | {result['submit_us_off']:.0f} | {result['submit_us_on']:.0f} | "
        f"{result['submit_us_on'] / result['submit_us_off']:.2f}× |",
        f"| no-op drain (jobs/s) | {result['drain_off']:,.0f} | {result['drain_on']:,.0f} | "
        f"{result['drain_on'] / result['drain_off']:.2f}× |",
    ]
    return "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--drain-jobs", type=int, default=8000)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    if shutil.which("hey") is None:
        raise SystemExit("bench.tracing needs hey (apt-get install hey)")
    target = Path(tempfile.mkdtemp(prefix="inferq-tracing-"))
    server = RedisServer(target / "redis")
    server.start()
    try:
        result = tracing_cost(server.url, target, args.rounds, args.drain_jobs)
    finally:
        server.stop()
        shutil.rmtree(target, ignore_errors=True)
    print(table(result))
    if args.out:
        args.out.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
