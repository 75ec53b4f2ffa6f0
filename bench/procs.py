"""Starting and stopping the processes a benchmark run measures."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

from inferq.shared.redis_server import die_with_parent

ROOT = Path(__file__).resolve().parent.parent


class Processes:
    """A group of child processes with logs, stopped together."""

    def __init__(self, log_dir: Path, env: dict[str, str], cwd: Path = ROOT) -> None:
        """``cwd``: the checkout the children run from (``python -m`` imports from it first); this one by default."""
        self.log_dir = log_dir
        self.cwd = cwd
        self.env = {**os.environ, "PYTHONPATH": str(cwd), **env}
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(self, name: str, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        log = (self.log_dir / f"{name}.log").open("ab")
        proc = subprocess.Popen(
            [sys.executable, "-m", *args],
            cwd=self.cwd,
            env={**self.env, **(env or {})},
            stdout=log,
            stderr=subprocess.STDOUT,
            preexec_fn=die_with_parent,
            # A group of its own, stopped whole: a server's forked and spawned children (LitServe's, uvicorn's
            # workers) go with it, and none is left running into the next measurement.
            start_new_session=True,
        )
        log.close()
        self.procs.append(proc)
        return proc

    def stop(self) -> None:
        for proc in self.procs:
            _signal_group(proc, signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            _signal_group(proc, signal.SIGKILL)  # whatever of its group outlived it
        self.procs.clear()


def _signal_group(proc: subprocess.Popen[bytes], sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, sig)


def wait_http(url: str, timeout_s: float = 90.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if httpx.get(url, timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"{url} did not answer within {timeout_s:.0f} s")
