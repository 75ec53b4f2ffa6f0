"""CPU time of what a benchmark row measures: every process and thread of a process tree, and a Redis server.

A wall rate on a shared 2-core machine moves by a third within minutes; the CPU time each job costs moves far
less, and it says which process (and which thread) spends it. Readers here:

- a process tree (a worker and any process it starts), from ``/proc``: each thread's nanoseconds on a CPU
  (``/proc/PID/task/TID/schedstat``, first field) by its name (``comm``), and each process's whole CPU clock
  (``clock_gettime`` of its process CPU clock), which also holds the threads that ended within the interval;
- a Redis server, from ``INFO cpu`` (``used_cpu_sys + used_cpu_user``: all its threads) and ``INFO commandstats``
  (calls and microseconds per command), with the server's idle CPU over an interval netted out (``net_idle``).

Python names its threads for itself only; ``bench.threadnames`` gives each OS thread its Python name, so a row
can read "the worker's prefetch thread" rather than "a thread of python3".
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

PROC = Path("/proc")
MAIN_THREAD = "MainThread"  # a process's first thread, named so whatever its comm says


@dataclass(frozen=True)
class ProcessSample:
    """One process at one instant: its threads' CPU nanoseconds by thread id, their names, and its whole clock."""

    pid: int
    parent: int
    comm: str
    threads: dict[int, int]  # tid -> ns on a CPU (schedstat)
    names: dict[int, str]  # tid -> name (MainThread for tid == pid, else comm)
    clock_ns: int | None  # the process CPU clock: every thread it ever had; None where it cannot be read


@dataclass(frozen=True)
class TreeSample:
    """A process and its descendants at one instant."""

    root: int
    processes: dict[int, ProcessSample]
    at_s: float  # time.monotonic() when read


@dataclass
class ProcessUsage:
    """What one process spent over an interval."""

    pid: int
    comm: str
    total_ns: int
    by_thread: dict[str, int] = field(default_factory=dict)  # thread name -> ns (same-named threads summed)
    exited_ns: int = 0  # threads that ended within the interval: in the clock, no longer in /proc


@dataclass
class TreeUsage:
    """What a process tree spent over an interval: every process and thread of it."""

    seconds: float
    processes: list[ProcessUsage]

    @property
    def total_ns(self) -> int:
        return sum(p.total_ns for p in self.processes)

    def thread_ns(self, name: str, process: str | None = None) -> int:
        """The CPU of the threads so named, in the root process (``process`` None) or in processes of that comm."""
        chosen = self.processes[:1] if process is None else [p for p in self.processes if p.comm == process]
        return sum(p.by_thread.get(name, 0) for p in chosen)

    def process_ns(self, comm: str) -> int:
        """The CPU of every process of the tree with this comm (a name the rebuilt worker gives its processes)."""
        return sum(p.total_ns for p in self.processes if p.comm == comm)

    def summary(self, per: int = 1) -> dict[str, Any]:
        """JSON-able, in microseconds, divided by ``per`` (jobs, for a figure per job)."""
        return {
            "seconds": self.seconds,
            "total_us": self.total_ns / 1000 / per,
            "processes": [
                {
                    "pid": p.pid,
                    "comm": p.comm,
                    "total_us": p.total_ns / 1000 / per,
                    "exited_threads_us": p.exited_ns / 1000 / per,
                    "threads_us": {name: ns / 1000 / per for name, ns in sorted(p.by_thread.items())},
                }
                for p in self.processes
            ],
        }


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:  # gone since it was listed
        return None


def threads(pid: int, proc: Path = PROC) -> tuple[dict[int, int], dict[int, str]]:
    """Every live thread of a process: ns on a CPU and name, by thread id."""
    spent: dict[int, int] = {}
    names: dict[int, str] = {}
    try:
        tids = sorted(int(entry.name) for entry in (proc / str(pid) / "task").iterdir() if entry.name.isdigit())
    except OSError:
        return spent, names
    for tid in tids:
        stat = _read(proc / str(pid) / "task" / str(tid) / "schedstat")
        if stat is None:
            continue
        spent[tid] = int(stat.split()[0])
        comm = (_read(proc / str(pid) / "task" / str(tid) / "comm") or "?").strip()
        names[tid] = MAIN_THREAD if tid == pid else comm
    return spent, names


def parents(proc: Path = PROC) -> dict[int, int]:
    """Every process's parent, from ``/proc/PID/stat`` (the field after the command's closing parenthesis)."""
    out = {}
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        stat = _read(entry / "stat")
        if stat is None:
            continue
        out[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    return out


def descendants(root: int, proc: Path = PROC) -> list[int]:
    """``root`` and every process below it, parents before children."""
    children: dict[int, list[int]] = {}
    for pid, parent in parents(proc).items():
        children.setdefault(parent, []).append(pid)
    out, todo = [], [root]
    while todo:
        pid = todo.pop(0)
        out.append(pid)
        todo += sorted(children.get(pid, []))
    return out


def process_clock_ns(pid: int) -> int | None:
    """A process's CPU clock (CLOCK_PROCESS_CPUTIME of another process: Linux's clock id for it), ns; every
    thread it ever had, the ended ones too. None when the process is gone or the clock cannot be read."""
    clock = (~pid << 3) | 2  # CPUCLOCK_SCHED of the whole process (linux/posix-timers.h: MAKE_PROCESS_CPUCLOCK)
    try:
        return time.clock_gettime_ns(clock)
    except OSError:
        return None


def sample(root: int, proc: Path = PROC) -> TreeSample:
    """The tree under ``root`` now. The clocks are read only from the real /proc (a test's tree has none)."""
    at = time.monotonic()
    found = {}
    family = parents(proc)
    for pid in descendants(root, proc):
        spent, names = threads(pid, proc)
        if not spent:
            continue
        comm = (_read(proc / str(pid) / "comm") or "?").strip()
        clock = process_clock_ns(pid) if proc == PROC else None
        found[pid] = ProcessSample(pid, family.get(pid, 0), comm, spent, names, clock)
    return TreeSample(root, found, at)


# A thread's end as ``bench.threadnames`` writes it down: (tid, name, its CPU ns over its whole life).
Ended = tuple[int, str, int]


def usage(before: TreeSample, after: TreeSample, ended: dict[int, list[Ended]] | None = None) -> TreeUsage:
    """What the tree spent between two samples: each process's CPU (its clock where read, else the sum of its
    threads), and its threads' by name. A process or thread that appeared in between counts from zero. A thread
    that ended in between counts by its name where ``ended`` (by pid) has its record, else as ``exited`` (from its
    process's clock); a process that ended in between is lost."""
    out = []
    for pid, now in after.processes.items():
        then = before.processes.get(pid)
        by_name: dict[str, int] = {}
        for tid, ns in now.threads.items():
            earlier = then.threads.get(tid, 0) if then else 0
            name = now.names.get(tid, "?")
            by_name[name] = by_name.get(name, 0) + ns - earlier
        for tid, name, ns in (ended or {}).get(pid, []):
            if tid not in now.threads:
                earlier = then.threads.get(tid, 0) if then else 0
                by_name[name] = by_name.get(name, 0) + ns - earlier
        threads_total = sum(by_name.values())
        total, exited = threads_total, 0
        clock_then = 0 if then is None else then.clock_ns
        if now.clock_ns is not None and clock_then is not None:
            total = now.clock_ns - clock_then
            exited = max(0, total - threads_total)
        out.append(ProcessUsage(pid, now.comm, total, by_name, exited))
    out.sort(key=lambda p: p.pid != after.root)  # the root first
    return TreeUsage(after.at_s - before.at_s, out)


def read_ended(log_dir: Path, offsets: dict[str, int] | None = None) -> dict[int, list[Ended]]:
    """The thread ends ``bench.threadnames`` wrote to ``log_dir`` (``threads.PID.log``), by pid; with ``offsets``
    (file name -> size at the interval's start, from ``log_sizes``), only those written since."""
    out: dict[int, list[Ended]] = {}
    for path in sorted(log_dir.glob("threads.*.log")):
        with path.open("rb") as file:
            file.seek((offsets or {}).get(path.name, 0))
            text = file.read().decode()
        pid = int(path.name.split(".")[1])
        for line in text.splitlines():
            head, _, ns = line.rpartition(" ")  # a thread's name may hold spaces: "Thread-1 (run)"
            tid, _, name = head.partition(" ")
            out.setdefault(pid, []).append((int(tid), name, int(ns)))
    return out


def log_sizes(log_dir: Path) -> dict[str, int]:
    return {path.name: path.stat().st_size for path in log_dir.glob("threads.*.log")}


class Tree:
    """A process tree to measure over an interval: ``start()``, then ``stop()`` gives its ``TreeUsage``; with
    ``log_dir``, threads that end in between count by name (the tree runs through ``bench.threadnames``)."""

    def __init__(self, pid: int, proc: Path = PROC, log_dir: Path | None = None) -> None:
        self.pid = pid
        self.proc = proc
        self.log_dir = log_dir
        self._before: TreeSample | None = None
        self._offsets: dict[str, int] = {}

    def start(self) -> None:
        if self.log_dir is not None:
            self._offsets = log_sizes(self.log_dir)
        self._before = sample(self.pid, self.proc)

    def stop(self) -> TreeUsage:
        assert self._before is not None, "start() first"
        after = sample(self.pid, self.proc)
        ended = read_ended(self.log_dir, self._offsets) if self.log_dir is not None else None
        return usage(self._before, after, ended)


# -- Redis ------------------------------------------------------------------------------------------------------


def redis_cpu_s(info: Mapping[str, Any]) -> float:
    """A Redis server's CPU seconds so far, every thread of it, from its ``INFO cpu``."""
    return float(info["used_cpu_sys"]) + float(info["used_cpu_user"])


def net_idle(busy_s: float, busy_interval_s: float, idle_s: float, idle_interval_s: float) -> float:
    """CPU spent over a busy interval less what the server spends idle over as long (its timers, other clients'
    polls), from an idle interval measured beside it."""
    if idle_interval_s <= 0:
        return busy_s
    return busy_s - idle_s * (busy_interval_s / idle_interval_s)


def commandstats(info: Mapping[str, Any]) -> dict[str, tuple[int, int]]:
    """``INFO commandstats`` as command -> (calls, microseconds); redis-py parses each ``cmdstat_*`` line."""
    out = {}
    for key, value in info.items():
        if key.startswith("cmdstat_") and isinstance(value, Mapping):
            out[key.removeprefix("cmdstat_")] = (int(value["calls"]), int(value["usec"]))
    return out


def commands_delta(
    before: Mapping[str, tuple[int, int]], after: Mapping[str, tuple[int, int]], per: int = 1
) -> dict[str, dict[str, float]]:
    """Calls and microseconds of each command between two ``commandstats``, divided by ``per``, costliest first.
    Commands a script runs count under their own names, and again inside the script's EVAL/EVALSHA time."""
    out = {}
    for name, (calls, usec) in after.items():
        calls_then, usec_then = before.get(name, (0, 0))
        if calls > calls_then:
            out[name] = {"calls": (calls - calls_then) / per, "us": (usec - usec_then) / per}
    return dict(sorted(out.items(), key=lambda kv: -kv[1]["us"]))


class RedisMeter:
    """A Redis server's CPU over an interval, with its idle CPU netted out, and its commands over it."""

    def __init__(
        self, connection: Any, clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep
    ) -> None:
        self.connection = connection
        self.clock, self.sleep = clock, sleep
        self.idle: tuple[float, float] = (0.0, 0.0)  # (CPU seconds, over seconds) of the last idle interval
        self._begun: tuple[float, float, dict[str, tuple[int, int]]] | None = None

    def cpu_s(self) -> float:
        return redis_cpu_s(self.connection.info("cpu"))

    def measure_idle(self, seconds: float) -> float:
        """The server's CPU per second while nothing measured runs, over ``seconds``: what ``stop`` nets out."""
        started, cpu = self.clock(), self.cpu_s()
        self.sleep(seconds)
        self.idle = (self.cpu_s() - cpu, self.clock() - started)
        return self.idle[0] / self.idle[1]

    def start(self) -> None:
        stats = commandstats(self.connection.info("commandstats"))
        self._begun = (self.clock(), self.cpu_s(), stats)

    def stop(self, per: int) -> dict[str, Any]:
        """CPU microseconds per ``per`` (jobs) since ``start``, idle netted out; and the commands per job."""
        assert self._begun is not None, "start() first"
        cpu = self.cpu_s()
        ended = self.clock()
        stats = commandstats(self.connection.info("commandstats"))
        started, cpu_then, stats_then = self._begun
        seconds = ended - started
        busy = cpu - cpu_then
        idle_s, idle_interval_s = self.idle
        return {
            "seconds": seconds,
            "cpu_us": net_idle(busy, seconds, idle_s, idle_interval_s) * 1e6 / per,
            "raw_cpu_us": busy * 1e6 / per,
            "idle_cpu_us_per_s": idle_s * 1e6 / idle_interval_s if idle_interval_s else 0.0,
            "commands": commands_delta(stats_then, stats, per),
        }
