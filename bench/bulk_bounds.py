"""How long one bulk upload or cancel can hold Redis, and how much one upload grows the API.

Run: ``python -m bench.bulk_bounds [--items 20000] [--big-mib 256]``. It starts a private redis-server and a real
API process (no worker: nothing runs, so the queue keeps every chunk), then

- uploads ``--items`` one-line items to a ``max_batch: 1`` model (one chunk, one RQ job, per item) and cancels
  the batch, reading Redis's SLOWLOG (threshold 0: every command is logged with the microseconds the server
  spent on it) for the longest single call of each, and the number of calls;
- uploads a body of ``--big-mib`` MiB (INFERQ_MAX_BATCH_BYTES, the largest allowed upload, by default) and reads
  the API's resident memory before, and its peak during the upload (/proc: VmRSS, then VmHWM after resetting it).

Times here are measurements to report, never asserted: the tests assert counts.
"""

from __future__ import annotations

import argparse
import json
import re
import tempfile
import time
from pathlib import Path
from typing import Any, cast

import httpx
from redis import Redis

from bench.procs import Processes, wait_http
from inferq.shared.redis_server import RedisServer, free_port

ONE = {
    "handler": "tests.support.echo:SlowEcho",
    "weights": "none",
    "input": {"kind": "tensor", "shape": [2]},
    "max_batch": 1,
}
# A wide tensor: few, long lines, so the largest body fits the bulk lane's item bound.
WIDE_NUMBERS = 2000
# Script calls: Redis counts a script's own commands under their names too, so only these are told apart.
SENT = {"cmdstat_eval", "cmdstat_evalsha"}
WIDE = {
    "handler": "tests.support.echo:SlowEcho",
    "weights": "none",
    "input": {"kind": "tensor", "shape": [WIDE_NUMBERS]},
    "max_batch": 64,
}


def _models(folder: Path) -> Path:
    for name, config in (("one", ONE), ("wide", WIDE)):
        (folder / name).mkdir(parents=True)
        (folder / name / "config.json").write_text(json.dumps(config))
    return folder


def _calls(redis: Redis) -> tuple[int, int]:
    """Script calls so far, and the microseconds Redis spent in them."""
    stats = cast(dict[str, dict[str, Any]], redis.info("commandstats"))
    used = [v for name, v in stats.items() if name in SENT]
    return sum(int(v["calls"]) for v in used), sum(int(v["usec"]) for v in used)


def _slowlog(redis: Redis, calls_before: tuple[int, int]) -> dict[str, Any]:
    """The longest call a client made since the reset, overall and per script (a script's own commands, logged as
    from ``?:0``, are skipped)."""
    entries = [e for e in redis.execute_command("SLOWLOG", "GET", "-1") if e[4] != b"?:0"]
    calls, usec = _calls(redis)
    made = calls - calls_before[0]
    out: dict[str, Any] = {"script_calls": made, "mean_ms": round((usec - calls_before[1]) / 1000 / max(made, 1), 3)}
    longest: dict[str, float] = {}
    for entry in entries:
        args = entry[3]
        name = args[0].decode().lower()
        if name in ("eval", "evalsha") and len(args) > 1:
            found = re.match(rb"-- inferq:([a-z-]+)", args[1])
            name = found.group(1).decode() if found else name
        longest[name] = max(longest.get(name, 0.0), entry[2] / 1000.0)
    if longest:
        out["longest_ms"] = max(longest.values())
        out["longest_ms_by_call"] = dict(sorted(longest.items(), key=lambda kv: -kv[1]))
    return out


def _reset_slowlog(redis: Redis) -> tuple[int, int]:
    # Only calls over 0.1 ms are logged: logging every command a script runs would slow the script itself.
    redis.config_set("slowlog-log-slower-than", 100)
    redis.config_set("slowlog-max-len", 100_000)
    redis.slowlog_reset()
    return _calls(redis)


def _memory_kib(pid: int) -> dict[str, int]:
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        name, _, value = line.partition(":")
        if name in ("VmRSS", "VmHWM"):
            fields[name] = int(value.split()[0])
    return fields


def _reset_peak(pid: int) -> None:
    Path(f"/proc/{pid}/clear_refs").write_text("5")  # the kernel's reset of VmHWM to the current RSS


def _upload(base: str, model: str, body: bytes) -> dict[str, Any]:
    response = httpx.post(
        f"{base}/v1/models/{model}/batches",
        content=body,
        headers={"content-type": "application/jsonl"},
        timeout=600,
    )
    assert response.status_code == 202, response.text[:500]
    answer: dict[str, Any] = response.json()
    return answer


def run(items: int, big_mib: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="inferq-bulk-bounds-") as tmp:
        server = RedisServer(Path(tmp) / "redis", appendonly=False)
        server.start()
        procs = Processes(Path(tmp), {})
        try:
            port = free_port()
            env = {
                "INFERQ_REDIS_URL": server.url,
                "INFERQ_MODELS_DIR": str(_models(Path(tmp) / "models")),
                "INFERQ_MAX_BATCH_BYTES": str(big_mib * 1024 * 1024),
            }
            api = procs.start("api", "inferq", "api", "--port", str(port), env=env)
            base = f"http://127.0.0.1:{port}"
            wait_http(f"{base}/readyz")
            redis = Redis.from_url(server.url)
            out: dict[str, Any] = {"items": items}

            line = json.dumps({"custom_id": "x" * 20, "inputs": [0.5] * WIDE_NUMBERS}).encode() + b"\n"
            count = big_mib * 1024 * 1024 // len(line)
            big = b"".join(line.replace(b"x" * 20, f"{i:020d}".encode()) for i in range(count))
            calls = _reset_slowlog(redis)
            before = _memory_kib(api.pid)
            _reset_peak(api.pid)
            started = time.perf_counter()
            _upload(base, "wide", big)
            out["largest_upload"] = {
                "body_bytes": len(big),
                "items": count,
                "wall_s": round(time.perf_counter() - started, 3),
                "rss_before_mib": round(before["VmRSS"] / 1024, 1),
                "rss_growth_mib": round((_memory_kib(api.pid)["VmHWM"] - before["VmRSS"]) / 1024, 1),
                **_slowlog(redis, calls),
            }
            redis.flushall()

            body = b"".join(
                json.dumps({"custom_id": f"item-{i}", "inputs": [i, i]}).encode() + b"\n" for i in range(items)
            )
            calls = _reset_slowlog(redis)
            before = _memory_kib(api.pid)
            _reset_peak(api.pid)
            started = time.perf_counter()
            batch = _upload(base, "one", body)
            out["upload"] = {
                "body_bytes": len(body),
                "wall_s": round(time.perf_counter() - started, 3),
                "rss_growth_mib": round((_memory_kib(api.pid)["VmHWM"] - before["VmRSS"]) / 1024, 1),
                **_slowlog(redis, calls),
            }
            out["queue_length"] = redis.llen("rq:queue:inferq.one.bulk")
            calls = _reset_slowlog(redis)
            started = time.perf_counter()
            response = httpx.post(f"{base}/v1/batches/{batch['id']}/cancel", timeout=600)
            out["cancel"] = {
                "status_code": response.status_code,
                "wall_s": round(time.perf_counter() - started, 3),
                **_slowlog(redis, calls),
            }
            out["after_cancel"] = httpx.get(f"{base}/v1/batches/{batch['id']}").json()["counts"]
            redis.close()
            return out
        finally:
            procs.stop()
            server.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--items", type=int, default=20_000)
    parser.add_argument("--big-mib", type=int, default=256)
    args = parser.parse_args()
    print(json.dumps(run(args.items, args.big_mib), indent=2))


if __name__ == "__main__":
    main()
