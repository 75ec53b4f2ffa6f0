"""Load generators that are not the bottleneck: ``hey`` or ``wrk`` when installed, else an asyncio
generator in a process of its own (``python -m bench.loadgen``), never in the bench's process.

Every figure comes with the generator's own ceiling, measured on a bare route of the same server
(``/healthz``) at the same concurrency: a figure within ``LIMITED_SHARE`` of it says more about the
generator than the server, and the table marks it "limited by the generator".
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
TOOLS = ("hey", "wrk", "python")
# A figure at or above this share of the generator's ceiling is marked "limited by the generator".
LIMITED_SHARE = 0.9


@dataclass
class LoadResult:
    """One load point: the same request, ``clients`` at a time, for ``duration_s``."""

    tool: str
    clients: int
    duration_s: float
    ok: int  # 2xx answers
    failed: int  # any other answer, or no answer (connect, read, timeout)
    p50_ms: float | None = None
    p90_ms: float | None = None
    p99_ms: float | None = None
    statuses: dict[str, int] = field(default_factory=dict)
    errors: dict[str, int] = field(default_factory=dict)

    @property
    def per_s(self) -> float:
        return self.ok / self.duration_s if self.duration_s else 0.0

    def summary(self) -> dict[str, Any]:
        return {**asdict(self), "per_s": self.per_s}


def pick_tool(prefer: str | None = None) -> str:
    """``hey``, then ``wrk``, then the asyncio generator; ``INFERQ_BENCH_LOADGEN`` or ``prefer`` names one."""
    wanted = prefer or os.environ.get("INFERQ_BENCH_LOADGEN")
    if wanted:
        if wanted not in TOOLS:
            raise ValueError(f"unknown load generator {wanted!r}: one of {', '.join(TOOLS)}")
        if wanted != "python" and shutil.which(wanted) is None:
            raise RuntimeError(f"load generator {wanted!r} is not installed")
        return wanted
    for tool in ("hey", "wrk"):
        if shutil.which(tool):
            return tool
    return "python"


def hammer(
    url: str,
    clients: int,
    duration_s: float,
    *,
    method: str = "GET",
    body: bytes | None = None,
    headers: dict[str, str] | None = None,
    timeout_s: float = 60.0,
    tool: str | None = None,
    bodies: list[bytes] | None = None,
) -> LoadResult:
    """``clients`` connections, each sending the same request again as soon as its answer came; with ``bodies``
    (wrk only: hey sends one body), each request takes the next of them in turn, a mix of inputs."""
    tool = pick_tool(tool)
    headers = dict(headers or {})
    with tempfile.TemporaryDirectory(prefix="inferq-load-") as tmp:
        body_path = Path(tmp) / "body"
        body_path.write_bytes(body or b"")
        if bodies:
            if tool != "wrk":
                raise ValueError("a mix of bodies needs wrk (hey and the asyncio generator send one body)")
            return _wrk_mix(url, clients, duration_s, method, bodies, headers, timeout_s, tmp)
        if tool == "hey":
            return _hey(url, clients, duration_s, method, body_path if body else None, headers, timeout_s)
        if tool == "wrk":
            return _wrk(url, clients, duration_s, method, body_path if body else None, headers, timeout_s, tmp)
        return _python(url, clients, duration_s, method, body_path if body else None, headers, timeout_s)


def _run(cmd: list[str], duration_s: float, timeout_s: float) -> str:
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=duration_s + timeout_s + 30, check=False)
    if done.returncode != 0 and "unable to connect" in done.stderr:
        # wrk gives up at once when no connection can be made: every request failed, none was counted.
        counts = {"duration_us": int(duration_s * 1e6), "requests": 0, "connect": 1, "read": 0, "write": 0}
        counts |= {"status": 0, "timeout": 0, "p50_us": 0, "p90_us": 0, "p99_us": 0}
        return f"INFERQ-WRK {json.dumps(counts)}"
    if done.returncode != 0:
        raise RuntimeError(f"{cmd[0]} exited with {done.returncode}: {done.stderr.strip()[-500:]}")
    return done.stdout


def _hey(
    url: str,
    clients: int,
    duration_s: float,
    method: str,
    body: Path | None,
    headers: dict[str, str],
    timeout_s: float,
) -> LoadResult:
    cmd = ["hey", "-z", f"{duration_s:g}s", "-c", str(clients), "-m", method, "-t", str(int(timeout_s))]
    for name, value in headers.items():
        if name.lower() == "content-type":
            cmd += ["-T", value]
        else:
            cmd += ["-H", f"{name}: {value}"]
    if body is not None:
        cmd += ["-D", str(body)]
    return parse_hey(_run([*cmd, url], duration_s, timeout_s), clients)


_HEY_LINE = re.compile(r"^\s*(\d+(?:\.\d+)?)% in (\d+(?:\.\d+)?) secs", re.M)
_HEY_COUNT = re.compile(r"^\s*\[(\d+)\]\s+(\d+) (?:responses|errors)?\s*$", re.M)


def parse_hey(text: str, clients: int) -> LoadResult:
    """hey's summary: total time, latency distribution, status code and error distributions."""
    total = re.search(r"Total:\s+(\d+(?:\.\d+)?) secs", text)
    if total is None:
        raise ValueError(f"not a hey summary: {text[:200]!r}")
    percentiles = {float(p): float(s) * 1000 for p, s in _HEY_LINE.findall(text)}
    slowest = re.search(r"Slowest:\s+(\d+(?:\.\d+)?) secs", text)
    if 99.0 not in percentiles and 50.0 in percentiles and slowest is not None:
        # hey leaves out a percentile past its last sample (under 100 answers): there, p99 is the slowest.
        percentiles[99.0] = float(slowest.group(1)) * 1000
    statuses: dict[str, int] = {}
    errors: dict[str, int] = {}
    section = ""
    for line in text.splitlines():
        if line.startswith("Status code distribution"):
            section = "status"
            continue
        if line.startswith("Error distribution"):
            section = "error"
            continue
        if line and not line.startswith(" "):
            section = ""
        found = re.match(r"^\s*\[(\d+)\]\s+(.*)$", line)
        if found is None or not section:
            continue
        if section == "status":
            statuses[found.group(1)] = int(found.group(2).split()[0])
        else:
            errors[found.group(2).strip()[:200]] = int(found.group(1))
    ok = sum(n for code, n in statuses.items() if code.startswith("2"))
    failed = sum(statuses.values()) - ok + sum(errors.values())
    return LoadResult(
        "hey",
        clients,
        float(total.group(1)),
        ok,
        failed,
        percentiles.get(50.0),
        percentiles.get(90.0),
        percentiles.get(99.0),
        statuses,
        errors,
    )


# wrk: a POST body from a file, every header, and a JSON summary printed by done().
_WRK_LUA = """
local f = assert(io.open(%(body)s, "rb"))
wrk.method = %(method)s
local body = f:read("*a")
f:close()
if #body > 0 then wrk.body = body end
%(headers)s
"""
_WRK_DONE = """
function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    'INFERQ-WRK {"duration_us": %%d, "requests": %%d, "connect": %%d, "read": %%d, "write": %%d, ' ..
    '"status": %%d, "timeout": %%d, "p50_us": %%d, "p90_us": %%d, "p99_us": %%d}\\n',
    summary.duration, summary.requests, e.connect, e.read, e.write, e.status, e.timeout,
    latency:percentile(50), latency:percentile(90), latency:percentile(99)))
end
"""


def _lua_string(value: str) -> str:
    return json.dumps(value)  # a JSON string literal is a valid Lua one for these characters


def _wrk(
    url: str,
    clients: int,
    duration_s: float,
    method: str,
    body: Path | None,
    headers: dict[str, str],
    timeout_s: float,
    tmp: str,
) -> LoadResult:
    script = Path(tmp) / "inferq.lua"
    header_lines = "\n".join(f"wrk.headers[{_lua_string(k)}] = {_lua_string(v)}" for k, v in headers.items())
    script.write_text(
        (_WRK_LUA + _WRK_DONE)
        % {
            "body": _lua_string(str(body or "/dev/null")),
            "method": _lua_string(method),
            "headers": header_lines,
        }
    )
    threads = max(1, min(2, clients))
    # wrk takes whole seconds.
    seconds, timeout = max(1, round(duration_s)), max(1, round(timeout_s))
    cmd = ["wrk", "-t", str(threads), "-c", str(clients), "-d", f"{seconds}s", "--timeout", f"{timeout}s"]
    return parse_wrk(_run([*cmd, "-s", str(script), url], duration_s, timeout_s), clients)


# wrk with a mix: the bodies read from files body.1 … body.N, each thread sending them in turn from its own start.
_WRK_MIX_LUA = """
wrk.method = %(method)s
%(headers)s
local bodies = {}
for i = 1, %(count)d do
  local f = assert(io.open(%(prefix)s .. i, "rb"))
  bodies[i] = f:read("*a")
  f:close()
end
local n = 0
function setup(thread)
  thread:set("start", math.random(#bodies))
end
function init(args)
  n = start or 0
end
function request()
  n = n + 1
  return wrk.format(nil, nil, nil, bodies[(n %% #bodies) + 1])
end
"""


def _wrk_mix(
    url: str,
    clients: int,
    duration_s: float,
    method: str,
    bodies: list[bytes],
    headers: dict[str, str],
    timeout_s: float,
    tmp: str,
) -> LoadResult:
    prefix = Path(tmp) / "body."
    for i, body in enumerate(bodies, 1):
        Path(f"{prefix}{i}").write_bytes(body)
    script = Path(tmp) / "inferq-mix.lua"
    header_lines = "\n".join(f"wrk.headers[{_lua_string(k)}] = {_lua_string(v)}" for k, v in headers.items())
    mix = (_WRK_MIX_LUA + _WRK_DONE) % {
        "method": _lua_string(method),
        "headers": header_lines,
        "count": len(bodies),
        "prefix": _lua_string(str(prefix)),
    }
    script.write_text(mix)
    threads = max(1, min(2, clients))
    seconds, timeout = max(1, round(duration_s)), max(1, round(timeout_s))
    cmd = ["wrk", "-t", str(threads), "-c", str(clients), "-d", f"{seconds}s", "--timeout", f"{timeout}s"]
    return parse_wrk(_run([*cmd, "-s", str(script), url], duration_s, timeout_s), clients)


def parse_wrk(text: str, clients: int) -> LoadResult:
    """The JSON line our Lua ``done()`` prints (wrk counts non-2xx/3xx answers as status errors)."""
    found = re.search(r"^INFERQ-WRK (\{.*\})$", text, re.M)
    if found is None:
        raise ValueError(f"no summary line in wrk's output: {text[:200]!r}")
    s = json.loads(found.group(1))
    errors = {name: s[name] for name in ("connect", "read", "write", "status", "timeout") if s[name]}
    # wrk counts a request that got a non-2xx/3xx answer in both `requests` and `status`.
    failed_answers = s["status"]
    ok = s["requests"] - failed_answers
    failed = failed_answers + s["connect"] + s["read"] + s["write"] + s["timeout"]
    answered = ok > 0
    return LoadResult(
        "wrk",
        clients,
        s["duration_us"] / 1e6,
        ok,
        failed,
        s["p50_us"] / 1000 if answered else None,
        s["p90_us"] / 1000 if answered else None,
        s["p99_us"] / 1000 if answered else None,
        {},
        errors,
    )


def _python(
    url: str,
    clients: int,
    duration_s: float,
    method: str,
    body: Path | None,
    headers: dict[str, str],
    timeout_s: float,
) -> LoadResult:
    spec = {
        "url": url,
        "clients": clients,
        "duration_s": duration_s,
        "method": method,
        "body": str(body) if body else None,
        "headers": headers,
        "timeout_s": timeout_s,
    }
    cmd = [sys.executable, "-m", "bench.loadgen", "fixed", json.dumps(spec)]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        cmd, capture_output=True, text=True, timeout=duration_s + timeout_s + 60, check=False, env=env, cwd=ROOT
    )
    if done.returncode != 0:
        raise RuntimeError(f"bench.loadgen exited with {done.returncode}: {done.stderr.strip()[-500:]}")
    return LoadResult(**json.loads(done.stdout.strip().splitlines()[-1]))


def limited(per_s: float, ceiling_per_s: float, calls_per_item: int = 1) -> bool:
    """Whether a figure is within ``LIMITED_SHARE`` of what the generator itself can send."""
    return ceiling_per_s > 0 and per_s * calls_per_item >= LIMITED_SHARE * ceiling_per_s


def python_loop(
    mode: str,
    call: str,
    call_args: list[str],
    payloads: list[bytes],
    duration_s: float,
    label: str,
    *,
    clients: int = 0,
    rate: float = 0.0,
) -> dict[str, Any]:
    """``bench.load``'s closed (``clients``) or open (``rate``) loop, run in a process of its own."""
    with tempfile.TemporaryDirectory(prefix="inferq-load-") as tmp:
        paths = []
        for i, payload in enumerate(payloads):
            path = Path(tmp) / f"p{i}"
            path.write_bytes(payload)
            paths.append(str(path))
        spec = {
            "call": call,
            "call_args": call_args,
            "payloads": paths,
            "duration_s": duration_s,
            "label": label,
            "clients": clients,
            "rate": rate,
        }
        done = subprocess.run(
            [sys.executable, "-m", "bench.loadgen", mode, json.dumps(spec)],
            capture_output=True,
            text=True,
            timeout=duration_s + 180,
            check=False,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
            cwd=ROOT,
        )
    if done.returncode != 0:
        raise RuntimeError(f"bench.loadgen {mode} exited with {done.returncode}: {done.stderr.strip()[-500:]}")
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))
