"""The benchmark's CPU readers (bench/cpu.py): a process tree's threads from /proc, thread names from
bench.threadnames, and Redis's CPU with its idle netted out."""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

import pytest

from bench import cpu, threadnames


def _process(proc: Path, pid: int, parent: int, comm: str, threads: dict[int, tuple[str, int]]) -> None:
    """A /proc/PID as the readers see it: its stat (the parent after the command), comm, and each thread's
    schedstat (ns on a CPU first) and comm."""
    folder = proc / str(pid)
    (folder / "task").mkdir(parents=True, exist_ok=True)
    (folder / "stat").write_text(f"{pid} ({comm} x) S {parent} {pid} {pid} 0 -1\n")
    (folder / "comm").write_text(f"{comm}\n")
    for tid, (name, ns) in threads.items():
        task = folder / "task" / str(tid)
        task.mkdir(exist_ok=True)
        (task / "schedstat").write_text(f"{ns} 777 9\n")
        (task / "comm").write_text(f"{name}\n")


def _tree(proc: Path, scale: int) -> None:
    """A worker (100) with two threads, its child (200) with two, their grandchild (300), and a stranger (400)."""
    _process(proc, 1, 0, "init", {1: ("init", 5)})
    _process(proc, 100, 1, "python3", {100: ("python3", 10 * scale), 101: ("inferq-prefetch", 20 * scale)})
    _process(proc, 200, 100, "feeder", {200: ("feeder", 30 * scale), 201: ("feeder", 40 * scale)})
    _process(proc, 300, 200, "decoder", {300: ("decoder", 50 * scale)})
    _process(proc, 400, 1, "stranger", {400: ("stranger", 1000 * scale)})


def test_the_tree_holds_every_thread_of_the_process_and_of_its_descendants_only(tmp_path: Path) -> None:
    _tree(tmp_path, 1)
    found = cpu.sample(100, tmp_path)
    assert sorted(found.processes) == [100, 200, 300]
    assert found.processes[100].threads == {100: 10, 101: 20}
    assert found.processes[100].names == {100: "MainThread", 101: "inferq-prefetch"}
    assert found.processes[200].threads == {200: 30, 201: 40} and found.processes[200].parent == 100
    assert found.processes[300].comm == "decoder" and found.processes[300].clock_ns is None  # no clock in a test


def test_usage_sums_each_process_and_names_its_threads(tmp_path: Path) -> None:
    _tree(tmp_path, 1)
    before = cpu.sample(100, tmp_path)
    _tree(tmp_path, 3)
    _process(tmp_path, 200, 100, "feeder", {200: ("feeder", 90), 201: ("feeder", 120), 202: ("late", 7)})
    used = cpu.usage(before, cpu.sample(100, tmp_path))
    by_pid = {p.pid: p for p in used.processes}
    assert [p.pid for p in used.processes][0] == 100  # the root first
    assert by_pid[100].total_ns == 20 + 40 and by_pid[100].by_thread == {"MainThread": 20, "inferq-prefetch": 40}
    # Two threads of one name are summed; one started in between counts from zero.
    assert by_pid[200].total_ns == 60 + 80 + 7 and by_pid[200].by_thread == {"MainThread": 60, "feeder": 80, "late": 7}
    assert by_pid[300].total_ns == 100
    assert used.total_ns == 60 + 147 + 100
    assert used.thread_ns("inferq-prefetch") == 40
    assert used.thread_ns("late", process="feeder") == 7
    assert used.process_ns("decoder") == 100 and used.process_ns("stranger") == 0
    assert used.summary(per=2)["processes"][0]["threads_us"] == {"MainThread": 0.01, "inferq-prefetch": 0.02}


def _one(pid: int, threads: dict[int, int], clock: int | None) -> cpu.TreeSample:
    names = {tid: "MainThread" if tid == pid else "inferq-prefetch" for tid in threads}
    return cpu.TreeSample(pid, {pid: cpu.ProcessSample(pid, 1, "python3", threads, names, clock)}, 0.0)


def test_threads_that_end_in_between_count_by_their_record_else_as_exited_from_the_clock() -> None:
    before = _one(100, {100: 1_000, 101: 500}, clock=10_000)
    after = _one(100, {100: 1_400}, clock=12_000)  # 101 ended; 102 and 103 lived and ended in between
    ended = {100: [(101, "inferq-prefetch", 900), (102, "inferq-prefetch", 300), (103, "Thread-3 (run)", 100)]}
    (used,) = cpu.usage(before, after, ended).processes
    assert used.total_ns == 2_000  # the process clock: every thread, the ended ones too
    assert used.by_thread == {"MainThread": 400, "inferq-prefetch": 400 + 300, "Thread-3 (run)": 100}
    assert used.exited_ns == 2_000 - 1_200  # what no record names
    (unrecorded,) = cpu.usage(before, after).processes
    assert unrecorded.by_thread == {"MainThread": 400} and unrecorded.exited_ns == 1_600


def test_threadnames_names_each_os_thread_and_writes_down_its_cpu_when_it_ends(tmp_path: Path) -> None:
    undo = threadnames.install(tmp_path)
    go = threading.Event()
    try:
        probe = threading.Thread(target=go.wait, name="bench-probe-thread-long", daemon=True)
        probe.start()
        spent, names = cpu.threads(os.getpid())
        assert names[probe.native_id] == "bench-probe-thr"  # the kernel keeps 15 bytes
        sizes = cpu.log_sizes(tmp_path)
        go.set()
        probe.join()
    finally:
        undo()
    ((tid, name, ns),) = cpu.read_ended(tmp_path)[os.getpid()]
    assert (tid, name) == (probe.native_id, "bench-probe-thread-long") and ns >= 0
    assert cpu.read_ended(tmp_path, sizes) == {os.getpid(): [(tid, name, ns)]}  # written after the sizes were read
    assert cpu.read_ended(tmp_path, cpu.log_sizes(tmp_path)) == {}


def test_the_idle_netting_subtracts_the_idle_rate_over_the_busy_interval() -> None:
    assert cpu.net_idle(0.010, 2.0, 0.002, 1.0) == pytest.approx(0.006)
    assert cpu.net_idle(0.010, 0.5, 0.002, 1.0) == pytest.approx(0.009)
    assert cpu.net_idle(0.010, 2.0, 0.002, 0.0) == 0.010  # no idle interval: nothing to net


class FakeRedis:
    """INFO cpu and commandstats as redis-py parses them, from a script of readings."""

    def __init__(self, cpu_s: list[float], stats: list[dict[str, tuple[int, int]]]) -> None:
        self.cpu_s, self.stats = list(cpu_s), list(stats)

    def info(self, section: str) -> dict[str, Any]:
        if section == "cpu":
            value = self.cpu_s.pop(0)
            return {"used_cpu_sys": value / 4, "used_cpu_user": value * 3 / 4, "used_cpu_sys_children": 9.0}
        return {
            f"cmdstat_{name}": {"calls": calls, "usec": usec, "usec_per_call": 1.0}
            for name, (calls, usec) in self.stats.pop(0).items()
        }


def test_the_redis_meter_nets_out_the_idle_cpu_and_counts_commands_per_job() -> None:
    now = [0.0]

    def clock() -> float:
        return now[0]

    def sleep(seconds: float) -> None:
        now[0] += seconds

    before = {"evalsha": (10, 1_000), "hset": (20, 100)}
    after = {"evalsha": (110, 9_000), "hset": (220, 600), "get": (5, 50)}
    redis = FakeRedis([1.000, 1.001, 2.000, 2.050], [before, after])
    meter = cpu.RedisMeter(redis, clock=clock, sleep=sleep)
    assert meter.measure_idle(2.0) == pytest.approx(0.0005)  # 1 ms over 2 s
    meter.start()
    now[0] += 4.0
    got = meter.stop(per=100)
    assert got["seconds"] == 4.0
    assert got["raw_cpu_us"] == pytest.approx(500.0)  # 50 ms over 100 jobs
    assert got["cpu_us"] == pytest.approx(480.0)  # less 2 ms of idle over the 4 s
    assert got["idle_cpu_us_per_s"] == pytest.approx(500.0)
    assert got["commands"] == {
        "evalsha": {"calls": 1.0, "us": 80.0},
        "hset": {"calls": 2.0, "us": 5.0},
        "get": {"calls": 0.05, "us": 0.5},
    }
    assert list(got["commands"]) == ["evalsha", "hset", "get"]  # costliest first
