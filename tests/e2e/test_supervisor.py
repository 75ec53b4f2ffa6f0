"""`inferq up`'s supervisor with stand-in children: the order it stops them in, a second Ctrl-C, giving up."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from tests.support.models import ROOT
from tests.support.waiting import wait_until

CHILD = """
import signal, sys, time
log, name, mode = sys.argv[1:]
terms = 0
def say(what):
    with open(log, "a") as f:
        f.write(f"{name} {what}\\n")
def term(signum, frame):
    global terms
    terms += 1
    say(f"SIGTERM {terms}")
    if mode == "finish" or terms == 2:  # "stubborn" children stop only at the second
        time.sleep(0.3)
        say("stopped")
        sys.exit(0)
signal.signal(signal.SIGTERM, term)
say("up")
if mode.startswith("exit"):
    sys.exit(int(mode[4:]))
while True:
    time.sleep(0.05)
"""
DRIVER = """
import sys
from inferq.supervisor import Child, Supervisor
log, child, grace, worker_mode, service_mode, cap = sys.argv[1:]
def make(name, mode):
    return Child(name, [sys.executable, child, log, name, mode])
workers, services = [make("worker a", worker_mode)], [make("api", service_mode)]
supervisor = Supervisor(workers, services, {}, None, float(grace), max_backoff_s=float(cap))
sys.exit(supervisor.run())
"""


def _supervise(
    tmp: Path, worker_mode: str, service_mode: str = "finish", cap_s: float = 30.0
) -> tuple[subprocess.Popen[bytes], Path]:
    (tmp / "child.py").write_text(CHILD)
    (tmp / "driver.py").write_text(DRIVER)
    log = tmp / "children.log"
    log.touch()
    with (tmp / "supervisor.log").open("wb") as said:
        proc = subprocess.Popen(
            [sys.executable, str(tmp / "driver.py"), str(log), str(tmp / "child.py"), "60", worker_mode, service_mode]
            + [str(cap_s)],
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
            stderr=said,
            start_new_session=True,
        )
    return proc, log


def test_workers_stop_first_then_the_services(tmp_path: Path) -> None:
    proc, log = _supervise(tmp_path, "finish")
    wait_until(lambda: len(log.read_text().splitlines()) == 2, 30, "both children")
    os.killpg(proc.pid, signal.SIGINT)  # the terminal's Ctrl-C: the children, in their own sessions, get none
    assert proc.wait(timeout=30) == 0
    lines = log.read_text().splitlines()
    assert sorted(lines[:2]) == ["api up", "worker a up"]
    assert lines[2:] == ["worker a SIGTERM 1", "worker a stopped", "api SIGTERM 1", "api stopped"]


def test_a_second_ctrl_c_hurries_a_worker_that_is_still_finishing(tmp_path: Path) -> None:
    proc, log = _supervise(tmp_path, "stubborn")
    wait_until(lambda: len(log.read_text().splitlines()) == 2, 30, "both children")
    os.killpg(proc.pid, signal.SIGINT)
    wait_until(lambda: "worker a SIGTERM 1" in log.read_text(), 30, "the first SIGTERM")
    os.killpg(proc.pid, signal.SIGINT)
    assert proc.wait(timeout=30) == 0  # well within the 60 s grace
    assert log.read_text().splitlines()[2:] == [
        "worker a SIGTERM 1",
        "worker a SIGTERM 2",
        "worker a stopped",
        "api SIGTERM 1",
        "api stopped",
    ]
    assert (
        "stopping worker a now: putting running batches back in their queues"
        in (tmp_path / "supervisor.log").read_text()
    )


def test_children_that_cannot_start_are_not_restarted_and_nothing_left_stops_it(tmp_path: Path) -> None:
    proc, _ = _supervise(tmp_path, "exit78", "exit78")
    assert proc.wait(timeout=30) == 78
    said = (tmp_path / "supervisor.log").read_text()
    assert said.count("worker a could not start (its error is above); not restarting it") == 1
    assert said.count("api could not start (its error is above); not restarting it") == 1
    assert "nothing can run as configured; stopping" in said


def test_a_crash_loop_is_never_given_up_it_backs_off_to_the_cap_and_says_so(tmp_path: Path) -> None:
    """The audit's Redis-full minute: five exits, and the supervisor gave up on its children for good."""
    proc, log = _supervise(tmp_path, "exit3", cap_s=0.5)
    wait_until(lambda: log.read_text().count("worker a up") >= 9, 60, "nine starts of the crashing worker")
    assert proc.poll() is None  # still supervising
    os.killpg(proc.pid, signal.SIGINT)
    assert proc.wait(timeout=30) == 0
    said = (tmp_path / "supervisor.log").read_text()
    assert "worker a exited with status 3; restarting it in 0 s" in said
    assert "worker a exited with status 3; restarting it in 0.5 s" in said
    assert "worker a exited 8 times within 60 s (last status 3); restarting it in 0.5 s" in said
    assert "not restarting" not in said


WORKER = """
import os, signal, sys, time
log, attempts = sys.argv[1:]
def say(what):
    with open(log, "a") as f:
        f.write(what + "\\n")
def drain(signum, frame):
    say("drains")
    sys.exit(0)
signal.signal(signal.SIGUSR1, drain)
signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(0))
ready = os.environ.get("_INFERQ_READY_FD")
if ready is None:
    say("serves")
else:  # a replacement: what its n-th start does
    with open(attempts, "a+") as f:
        f.write("x")
        f.seek(0)
        n = len(f.read())
    if n == 1:
        say(f"loads {os.getpid()}")  # the test kills it here, as the OOM killer would
    elif n == 2:
        os.write(int(ready), b"ready\\n")
        say("takes over")
    else:
        say("cannot load")
        sys.exit(78)
while True:
    time.sleep(0.05)
"""
WATCHING = """
import sys
from pathlib import Path
from inferq.supervisor import Child, Supervisor
log, worker, attempts, weights = sys.argv[1:]
command = [sys.executable, worker, log, attempts]
def watch():
    return {"worker a": (command, Path(weights).read_text())}
supervisor = Supervisor([Child("worker a", command)], [], {}, None, 60.0, watch=watch, watch_s=0.1)
sys.exit(supervisor.run())
"""


def test_a_replacement_killed_while_it_loads_is_tried_again_and_one_that_cannot_load_is_not(tmp_path: Path) -> None:
    """The audit's OOM kill of a replacement worker loading new weights: read as broken weights, never tried again
    until the files changed, and said as "its error is above" with no error above."""
    (tmp_path / "worker.py").write_text(WORKER)
    (tmp_path / "driver.py").write_text(WATCHING)
    log, weights = tmp_path / "children.log", tmp_path / "weights"
    log.touch()
    weights.write_text("first")
    with (tmp_path / "supervisor.log").open("wb") as said:
        proc = subprocess.Popen(
            [sys.executable, str(tmp_path / "driver.py"), str(log), str(tmp_path / "worker.py")]
            + [str(tmp_path / "attempts"), str(weights)],
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
            stderr=said,
            start_new_session=True,
        )
    try:
        wait_until(lambda: log.read_text() == "serves\n", 30, "the serving worker")
        weights.write_text("second")  # new weights: a replacement loads them beside the serving worker
        wait_until(lambda: "loads" in log.read_text(), 30, "the replacement to load")
        loading = int(log.read_text().split("loads ")[1].split()[0])
        os.kill(loading, signal.SIGKILL)
        wait_until(lambda: "drains" in log.read_text(), 30, "the replacement tried again to take over")
        assert log.read_text().splitlines() == ["serves", f"loads {loading}", "takes over", "drains"]
        weights.write_text("third")  # weights that cannot load: said, not tried again
        wait_until(lambda: "could not start" in (tmp_path / "supervisor.log").read_text(), 30, "the load error")
        os.killpg(proc.pid, signal.SIGINT)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert log.read_text().splitlines()[4:] == ["cannot load"]
    told = (tmp_path / "supervisor.log").read_text()
    assert (
        "worker a: the new worker for its changed model was killed by SIGKILL while it loaded, with no error of its "
        "own (killed from outside, or out of memory); trying it again in 0 s, the running one serves until then"
    ) in told
    assert told.count("its error is above") == 1
    assert (
        "worker a: the new worker for its changed model could not start (its error is above); the running one keeps "
        "serving the model as it was"
    ) in told
