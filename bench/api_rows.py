"""The API's rows of issue 11, measured with ``hey``: submit vs /healthz, N API processes, many waiting clients.

Each row starts its own Redis and API (and, for the wait sweep, a worker), so both sides of a ratio
are measured back to back against the same process. ``python -m bench.api_rows`` prints them all.
"""

from __future__ import annotations

import csv
import io
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import redis as redis_py

from shared.redis_server import die_with_parent, find_redis_server, free_port

ROOT = Path(__file__).resolve().parent.parent
DIGIT = ROOT / "samples" / "digit.png"
SUBMIT_PATH = "/v1/models/digits/jobs"


@dataclass(frozen=True)
class Load:
    """What one ``hey`` run measured."""

    rps: float
    p50_s: float
    p99_s: float
    statuses: dict[int, int]
    errors: int

    @property
    def requests(self) -> int:
        return sum(self.statuses.values())


def parse_hey(text: str) -> Load:
    """``hey``'s summary as numbers; errors are transport errors (no response at all)."""
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", text).group(1))  # type: ignore[union-attr]
    percentiles = {int(p): float(s) for p, s in re.findall(r"(\d+)%+ in ([\d.]+) secs", text)}
    statuses = {int(c): int(n) for c, n in re.findall(r"\[(\d{3})\]\s+(\d+) responses", text)}
    error_block = text.split("Error distribution:", 1)
    errors = sum(int(n) for n in re.findall(r"\[(\d+)\]\s", error_block[1])) if len(error_block) == 2 else 0
    return Load(rps, percentiles.get(50, 0.0), percentiles.get(99, 0.0), statuses, errors)


def _hey_command(url: str, clients: int, duration_s: float, submit: bool, wait_s: float) -> list[str]:
    binary = shutil.which("hey")
    if binary is None:
        raise RuntimeError("hey is not installed")
    command = [binary, "-z", f"{duration_s:g}s", "-c", str(clients), "-t", "120"]
    if submit:
        command += ["-m", "POST", "-T", "image/png", "-D", str(DIGIT)]
    if wait_s:
        command += ["-H", f"Prefer: wait={wait_s:g}"]
    return [*command, url]


def hey(url: str, clients: int, duration_s: float, *, submit: bool = False, wait_s: float = 0) -> Load:
    """One ``hey`` run against ``url``: GETs, or digit submits (``Prefer: wait`` when ``wait_s``)."""
    command = _hey_command(url, clients, duration_s, submit, wait_s)
    out = subprocess.run(command, capture_output=True, text=True, check=True, timeout=duration_s + 180)
    return parse_hey(out.stdout)


def _load_of(rows: list[tuple[float, float, int]], duration_s: float) -> Load:
    """(offset, response time, status) rows as a Load; status 0: no response (hey's CSV)."""
    times = sorted(t for _, t, _ in rows)
    statuses: dict[int, int] = {}
    for _, _, status in rows:
        statuses[status] = statuses.get(status, 0) + 1
    errors = statuses.pop(0, 0)

    def at(q: float) -> float:
        return times[min(len(times) - 1, int(len(times) * q))] if times else 0.0

    return Load(len(rows) / duration_s, at(0.5), at(0.99), statuses, errors)


def hey_with_opening(
    url: str, clients: int, duration_s: float, *, submit: bool = False, wait_s: float = 0
) -> tuple[Load, Load]:
    """One ``hey`` run, and the same run without each client's first request (hey sends them all at once)."""
    command = _hey_command(url, clients, duration_s, submit, wait_s)
    command[1:1] = ["-o", "csv"]
    out = subprocess.run(command, capture_output=True, text=True, check=True, timeout=duration_s + 180)
    rows = [
        (float(r["offset"]), float(r["response-time"]), int(r["status-code"] or 0))
        for r in csv.DictReader(io.StringIO(out.stdout))
    ]
    rows.sort()
    return _load_of(rows, duration_s), _load_of(rows[clients:], duration_s)


class Stack:
    """A Redis, one ``inferq api`` (with ``workers`` processes) and optionally a digits worker."""

    def __init__(self, tmp: Path, api_workers: int = 1, worker: bool = False) -> None:
        self.tmp = tmp
        self.redis_port = free_port()
        self.port = free_port()
        self.api_workers = api_workers
        self.worker = worker
        self.procs: list[subprocess.Popen[bytes]] = []
        self.env = {
            **os.environ,
            "PYTHONPATH": str(ROOT),
            "INFERQ_REDIS_URL": self.redis_url,
            "INFERQ_MODELS_DIR": str(ROOT / "models"),
            "INFERQ_API_WORKERS": str(api_workers),
            # Submits measured with the worker paused fill the queue faster than the default cap allows.
            "INFERQ_MAX_QUEUE_LENGTH": "1000000",
        }

    @property
    def redis_url(self) -> str:
        return f"redis://127.0.0.1:{self.redis_port}/0"

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _spawn(self, name: str, command: Sequence[str]) -> subprocess.Popen[bytes]:
        log = (self.tmp / f"{name}.log").open("ab")
        proc = subprocess.Popen(
            list(command), cwd=ROOT, env=self.env, stdout=log, stderr=subprocess.STDOUT, preexec_fn=die_with_parent
        )
        log.close()
        self.procs.append(proc)
        return proc

    def start(self) -> None:
        self._spawn(
            "redis",
            [find_redis_server(), "--port", str(self.redis_port), "--bind", "127.0.0.1", "--save", ""]
            + ["--appendonly", "no", "--dir", str(self.tmp)],
        )
        client = redis_py.Redis.from_url(self.redis_url)
        _until(lambda: _pings(client), "redis")
        me = [sys.executable, "-m", "inferq", "--log-level", "warning"]
        self._spawn("api", [*me, "api", "--port", str(self.port)])
        _until(lambda: _answers(f"{self.base}/healthz"), "the API")
        if self.worker:
            self._spawn("worker", [*me, "worker", "--model", "digits"])
            _until(lambda: _digits_worker(self.base), "the digits worker")

    def flush(self) -> None:
        """Empty Redis between runs: a paused worker's queue grows while submits are measured."""
        client = redis_py.Redis.from_url(self.redis_url)
        client.flushdb()
        client.close()

    def stop(self) -> None:
        for proc in reversed(self.procs):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()


def _pings(client: redis_py.Redis) -> bool:
    try:
        return bool(client.ping())
    except redis_py.RedisError:
        return False


def _answers(url: str, needle: str = "") -> bool:
    try:
        response = httpx.get(url, timeout=2)
    except httpx.HTTPError:
        return False
    return response.status_code == 200 and needle in response.text


def _digits_worker(base: str) -> bool:
    try:
        return bool(httpx.get(f"{base}/readyz", timeout=2).json()["workers"].get("digits"))
    except (httpx.HTTPError, ValueError, KeyError):
        return False


def _until(check: object, what: str, timeout_s: float = 90.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():  # type: ignore[operator]
            return
        time.sleep(0.1)
    raise RuntimeError(f"{what} did not come up in {timeout_s:g} s")


@contextmanager
def stack(api_workers: int = 1, worker: bool = False) -> Iterator[Stack]:
    with tempfile.TemporaryDirectory(prefix="inferq-api-rows-") as tmp:
        running = Stack(Path(tmp), api_workers, worker)
        try:
            running.start()
            yield running
        finally:
            running.stop()


@dataclass(frozen=True)
class SubmitRow:
    api_workers: int
    healthz: Load
    submit: Load

    @property
    def ratio(self) -> float:
        return self.submit.rps / self.healthz.rps


def submit_row(api_workers: int = 1, clients: int = 64, duration_s: float = 8.0) -> SubmitRow:
    """/healthz then digit submits, back to back against one API (worker not running)."""
    with stack(api_workers) as running:
        hey(f"{running.base}/healthz", clients, 1.0)  # warm up: connections, imports, caches
        hey(running.base + SUBMIT_PATH, clients, 1.0, submit=True)
        running.flush()
        healthz = hey(f"{running.base}/healthz", clients, duration_s)
        submit = hey(running.base + SUBMIT_PATH, clients, duration_s, submit=True)
        running.flush()
    return SubmitRow(api_workers, healthz, submit)


def sweep_duration_s(clients: int, duration_s: float = 8.0) -> float:
    """How long to run ``clients``: hey opens every connection at once, and that opening burst (one request
    per client, all queued behind each other) must not be most of what p99 measures: at 1,024 clients it is
    a third of an 8 s run's requests, and its wait in the listen queue alone reaches seconds."""
    return max(duration_s, clients / 32)


def wait_sweep(
    clients: Sequence[int] = (16, 64, 256, 1024), duration_s: float = 8.0, wait_s: float = 30.0
) -> dict[int, tuple[Load, Load]]:
    """``Prefer: wait`` submits at each concurrency against one API and one digits worker: every request,
    and every request but each client's first (the opening burst)."""
    out: dict[int, tuple[Load, Load]] = {}
    with stack(worker=True) as running:
        hey(running.base + SUBMIT_PATH, 16, 1.0, submit=True, wait_s=wait_s)
        for n in clients:
            out[n] = hey_with_opening(
                running.base + SUBMIT_PATH, n, sweep_duration_s(n, duration_s), submit=True, wait_s=wait_s
            )
    return out


def main() -> None:
    rows = [submit_row(1), submit_row(2)]
    for row in rows:
        print(
            f"api workers {row.api_workers}: /healthz {row.healthz.rps:,.0f}/s, submit {row.submit.rps:,.0f}/s "
            f"(ratio {row.ratio:.2f}, statuses {row.submit.statuses})"
        )
    print(f"submit rate, 2 API processes / 1: {rows[1].submit.rps / rows[0].submit.rps:.2f}x")
    sweep = wait_sweep()
    best = max(load.rps for load, _ in sweep.values())
    for n, (load, steady) in sweep.items():
        print(
            f"wait, {n:>5} clients, {sweep_duration_s(n):g} s: {load.rps:,.0f}/s ({load.rps / best:.2f} of best), "
            f"p50 {load.p50_s * 1000:.0f} ms, "
            f"p99 {load.p99_s * 1000:.0f} ms (p99/p50 {load.p99_s / max(load.p50_s, 1e-9):.1f}), "
            f"statuses {load.statuses}, transport errors {load.errors}; without the opening burst: "
            f"p50 {steady.p50_s * 1000:.0f} ms, p99 {steady.p99_s * 1000:.0f} ms "
            f"(p99/p50 {steady.p99_s / max(steady.p50_s, 1e-9):.1f})"
        )


if __name__ == "__main__":
    main()
