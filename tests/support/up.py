"""`inferq up` in end-to-end tests: started from a folder of its own, stopped as Ctrl-C stops it."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx

from inferq.shared.redis_server import free_port
from tests.support.models import ROOT
from tests.support.waiting import wait_until


def stop_up(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()  # lets `up` stop its Redis and children
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@contextlib.contextmanager
def up_serving(
    tmp_path: Path, ready_s: float, **settings: str
) -> Iterator[tuple[subprocess.Popen[bytes], str, dict[str, str]]]:
    """`inferq up` run from ``tmp_path`` (its own Redis data under state/, a free port, this checkout's inferq, the
    ``settings`` given, its output in up.log), once ready: (its process, the API's URL, its environment). Stopped
    after, as `stop_up` stops it, unless the test stopped it itself."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("INFERQ_")}
    env |= {"INFERQ_PORT": str(port), "INFERQ_DATA_DIR": str(tmp_path / "state"), "PYTHONPATH": str(ROOT), **settings}
    base = f"http://127.0.0.1:{port}"
    with (tmp_path / "up.log").open("wb") as log:
        proc = subprocess.Popen([sys.executable, "-m", "inferq", "up"], cwd=tmp_path, env=env, stdout=log, stderr=log)
        try:
            wait_until(lambda: answers(f"{base}/readyz"), ready_s, "inferq up to be ready")
            yield proc, base, env
        finally:
            stop_up(proc)


def answers(url: str) -> bool:
    try:
        return httpx.get(url, timeout=1).status_code == 200
    except httpx.HTTPError:
        return False
