"""Where a feed round's CPU goes (``python -m bench.feed --profile``): what the rebuild of issue 46 acts on.

- Redis: every command of a phase in the server's SLOWLOG (its threshold at 0 for the phase, so each command is
  logged with its microseconds): each script by name (``EVALSHA``'s hash or ``EVAL``'s ``-- inferq:NAME`` line)
  with the commands it ran inside (logged just before it, by the script's client ``?:0``), and every other
  command; per job. Logging every command costs the server too: a profile round is never a measured one.
- The worker: py-spy (where installed: ``pip install py-spy``; not a dependency) samples every thread of it over
  the drain; its collapsed stacks are summed into the functions that hold the most samples, by thread, themselves
  and with what they call.
"""

from __future__ import annotations

import shutil
import signal
import subprocess
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

from inferq.shared.lifecycle import bulk_scripts, scripts

SCRIPT_CLIENT = b"?:0"  # the client a script's own commands are logged under
SLOWLOG_LEN = 2_000_000


def script_names() -> dict[str, str]:
    """Every lifecycle script's hash -> its name."""
    return {script.sha: script.name for script in (*scripts.ALL, *bulk_scripts.ALL)}


def _name(args: list[bytes], names: dict[str, str]) -> str:
    command = args[0].decode().upper()
    if command == "EVALSHA" and len(args) > 1:
        return f"EVALSHA {names.get(args[1].decode(), args[1].decode()[:12])}"
    if command == "EVAL" and len(args) > 1:
        first = args[1].decode(errors="replace").split("\n", 1)[0]
        return f"EVAL {first.removeprefix('-- inferq:')}" if first.startswith("-- inferq:") else "EVAL ?"
    return command


def summarise_slowlog(entries: list[list[Any]], per: int, names: dict[str, str] | None = None) -> dict[str, Any]:
    """SLOWLOG GET's raw entries (newest first, as Redis gives them) -> per job: each top-level command or script
    by name, its calls, microseconds and share of the phase's, and for a script the commands it ran inside. A
    script's time holds the logging of its own commands: read the shares, and the costs from commandstats."""
    names = script_names() if names is None else names
    top: dict[str, dict[str, Any]] = {}
    inside: list[str] = []
    for entry in reversed(entries):
        duration_us, args, client = int(entry[2]), entry[3], entry[4]
        command = args[0].decode().upper()
        if client == SCRIPT_CLIENT:
            inside.append(command)
            continue
        if command in ("SLOWLOG", "CONFIG", "INFO"):
            inside.clear()
            continue
        name = _name(args, names)
        row = top.setdefault(name, {"calls": 0, "us": 0, "inner": Counter()})
        row["calls"] += 1
        row["us"] += duration_us
        if command in ("EVAL", "EVALSHA"):
            row["inner"].update(inside)
        inside.clear()
    out = {}
    for name, row in sorted(top.items(), key=lambda kv: -kv[1]["us"]):
        calls = row["calls"]
        out[name] = {
            "calls": calls / per,
            "us": row["us"] / per,
            "share": row["us"] / max(sum(r["us"] for r in top.values()), 1),
            "us_per_call": row["us"] / calls,
            "inner_per_job": {c: n / per for c, n in row["inner"].most_common()},
        }
    return out


class SlowLog:
    """Every command between ``start`` and ``stop`` logged; ``stop(jobs)`` gives the summary per job."""

    def __init__(self, connection: Any) -> None:
        self.connection = connection
        self.before: dict[str, Any] = {}

    def start(self) -> None:
        self.before = {
            key: self.connection.config_get(key)[key] for key in ("slowlog-log-slower-than", "slowlog-max-len")
        }
        self.connection.config_set("slowlog-max-len", SLOWLOG_LEN)
        self.connection.config_set("slowlog-log-slower-than", 0)
        self.connection.slowlog_reset()

    def stop(self, jobs: int) -> dict[str, Any]:
        try:
            entries = self.connection.execute_command("SLOWLOG", "GET", "-1")
            return {"logged": len(entries), "commands": summarise_slowlog(entries, max(jobs, 1))}
        finally:
            for key, value in self.before.items():
                self.connection.config_set(key, value)
            self.connection.slowlog_reset()


def py_spy() -> str | None:
    """py-spy's path where installed (the venv's own first)."""
    import sys

    beside = Path(sys.executable).parent / "py-spy"
    return str(beside) if beside.exists() else shutil.which("py-spy")


class Sampler:
    """py-spy sampling every thread of a process (and its children) from ``start`` to ``stop``."""

    def __init__(self, pid: int, out: Path, rate_hz: int = 400) -> None:
        self.pid, self.out, self.rate_hz = pid, out, rate_hz
        self.spy: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        tool = py_spy()
        if tool is None:
            return
        command = [tool, "record", "--pid", str(self.pid), "--rate", str(self.rate_hz), "--format", "raw"]
        command += ["--threads", "--subprocesses", "--function", "--nonblocking", "--output", str(self.out)]
        self.spy = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)

    def stop(self) -> dict[str, Any]:
        if self.spy is None:
            return {"unavailable": "py-spy is not installed (pip install py-spy)"}
        self.spy.send_signal(signal.SIGINT)  # py-spy writes its file on SIGINT
        _, err = self.spy.communicate(timeout=60)
        if not self.out.exists():
            return {"unavailable": f"py-spy wrote nothing: {err.decode(errors='replace')[-300:]}"}
        return summarise_stacks(self.out.read_text())


def summarise_stacks(collapsed: str, top: int = 15) -> dict[str, Any]:
    """py-spy's collapsed stacks (``[process PID:"command";]thread (TID): NAME;frame;...;frame COUNT``, the outermost
    frame first) -> each thread's
    share of the samples, and the functions holding the most: themselves (the innermost frame) and with what
    they call (any frame of the stack)."""
    own: Counter[str] = Counter()
    within: Counter[str] = Counter()
    threads: Counter[str] = Counter()
    by_thread: dict[str, Counter[str]] = defaultdict(Counter)
    total = 0
    for line in collapsed.splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        frames = stack.split(";")
        while frames and frames[0].startswith("process "):  # --subprocesses: the process first, then the thread
            frames.pop(0)
        # "thread (TID): NAME" -> NAME: today's worker starts a prefetch thread per batch, each its own TID.
        thread = "?"
        if frames and frames[0].startswith("thread "):
            thread = frames.pop(0).partition("): ")[2] or "?"
        calls = frames or ["(no Python frame)"]
        total += count
        threads[thread] += count
        own[calls[-1]] += count
        by_thread[thread][calls[-1]] += count
        for frame in set(calls):
            within[frame] += count

    def shares(counter: Counter[str]) -> list[tuple[str, float]]:
        return [(name, n / max(total, 1)) for name, n in counter.most_common(top)]

    return {
        "samples": total,
        "threads": shares(threads),
        "self": shares(own),
        "inclusive": shares(within),
        # inferq's own functions with what they call: the rooms a rebuild moves work between.
        "inferq_inclusive": shares(Counter({f: n for f, n in within.items() if "(inferq/" in f})),
        "self_by_thread": {t: shares(c)[:8] for t, c in by_thread.items()},
    }
