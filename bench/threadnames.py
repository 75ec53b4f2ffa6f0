"""``python -m bench.threadnames ARGS``: ``inferq ARGS``, each Python thread's OS thread named as the thread is, and
what each thread spent on a CPU written down when it ends.

Python keeps a thread's name to itself: in ``/proc/PID/task/TID/comm`` every thread of a worker reads ``python3``,
so a CPU reader (``bench.cpu``) cannot say which of them spent what; and a thread that ends between two readings
(today's worker starts a prefetch thread per batch) is gone from ``/proc`` with its time. Here each thread
started through ``threading`` gives its name (its first 15 bytes, the kernel's limit) to its OS thread before it
runs, and when it ends appends ``TID NAME NS`` (its CPU nanoseconds) to ``threads.PID.log`` in the folder
``BENCH_THREADS_LOG`` names, which ``bench.cpu.Tree`` reads. Nothing of inferq changes; threads started by C code
(torch's intra-op pool) keep the process's name and write nothing.
"""

from __future__ import annotations

import ctypes
import os
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

LOG_DIR_ENV = "BENCH_THREADS_LOG"
_PR_SET_NAME = 15  # linux/prctl.h
_libc = ctypes.CDLL(None, use_errno=True)


def name_this_thread(name: str) -> None:
    """Give the calling OS thread ``name`` (cut to 15 bytes)."""
    _libc.prctl(_PR_SET_NAME, ctypes.c_char_p(name.encode()[:15]), 0, 0, 0)


def log_path(folder: Path, pid: int) -> Path:
    return folder / f"threads.{pid}.log"


def install(log_dir: Path | None = None) -> Callable[[], None]:
    """Name every thread ``threading`` starts from now on; with ``log_dir``, write down each one's CPU at its end.
    Returns what undoes it (for a test in a process that goes on).

    ``Thread._bootstrap_inner`` is where every thread begins and ends, whatever its class does with ``run``:
    wrapped here, in the benchmark's launcher only, as nothing public runs code at a thread's end."""
    fd = None
    if log_dir is not None:
        fd = os.open(log_path(log_dir, os.getpid()), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    bootstrap = threading.Thread._bootstrap_inner  # type: ignore[attr-defined]

    def named(self: threading.Thread) -> None:
        name_this_thread(self.name)
        try:
            bootstrap(self)
        finally:
            if fd is not None:
                # One write of one short line to an O_APPEND file: threads ending at once do not interleave.
                os.write(fd, f"{threading.get_native_id()} {self.name} {time.thread_time_ns()}\n".encode())

    threading.Thread._bootstrap_inner = named  # type: ignore[attr-defined]

    def undo() -> None:
        threading.Thread._bootstrap_inner = bootstrap  # type: ignore[attr-defined]
        if fd is not None:
            os.close(fd)

    return undo


def main() -> None:
    folder = os.environ.get(LOG_DIR_ENV)
    install(Path(folder) if folder else None)
    from inferq.cli import main as inferq

    sys.exit(inferq(sys.argv[1:]))


if __name__ == "__main__":
    main()
