"""Real processes for end-to-end tests: a private Redis, the API, workers and the webhook sender."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import redis as redis_py

from inferq.shared.redis_server import RedisServer, die_with_parent, free_port
from tests.support.models import ROOT, make_models_dir
from tests.support.waiting import wait_until
from tests.support.webhooks import WEBHOOK_SECRET


@dataclass
class Stack:
    """A running inferq: Redis plus whatever processes a test started."""

    tmp: Path
    redis_server: RedisServer
    models_dir: Path
    port: int
    env: dict[str, str]
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)
    logs: list[Path] = field(default_factory=list)

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def redis_url(self) -> str:
        return self.redis_server.url

    def redis(self) -> redis_py.Redis:
        return redis_py.Redis.from_url(self.redis_url)

    def start(self, *args: str, name: str, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        log_path = self.tmp / f"{name}.{len(self.logs)}.log"
        log_file = log_path.open("wb")
        proc = subprocess.Popen(
            [sys.executable, "-m", "inferq", *args],
            cwd=ROOT,
            env={**self.env, **(env or {})},
            stdout=log_file,
            stderr=subprocess.STDOUT,
            preexec_fn=die_with_parent,  # a killed test run leaves no orphans
        )
        log_file.close()
        self.procs.append(proc)
        self.logs.append(log_path)
        return proc

    def start_api(self) -> None:
        self.start("api", "--port", str(self.port), name="api")
        wait_until(lambda: _ready(self.base), 30, "the API to answer /readyz")

    def start_worker(
        self, *models: str, extra: Iterable[str] = (), name: str = "worker", env: dict[str, str] | None = None
    ) -> subprocess.Popen[bytes]:
        args = ["worker"]
        for model in models:
            args += ["--model", model]
        return self.start(*args, *extra, name=name, env=env)

    def run_burst(self, *models: str, extra: Iterable[str] = ()) -> str:
        """Run a worker that drains the queue and quits; its log."""
        proc = self.start_worker(*models, extra=["--burst", *extra], name="burst")
        proc.wait(timeout=60)
        return self.logs[self.procs.index(proc)].read_text()

    def wait_for_worker(self, model: str, timeout_s: float = 120) -> None:
        """Until a worker listening on the model's queue has registered in Redis.

        A wait, not a bound: a worker of three models took 52 s to register on 2 busy cores (torch's import, each
        model's load and warm-up), so the default leaves room; a healthy start returns in seconds."""
        client = self.redis()
        try:
            wait_until(
                lambda: any(
                    f"inferq.{model}".encode() in (client.hget(key, "queues") or b"").split(b",")
                    for key in client.smembers("rq:workers")
                ),
                timeout_s,
                f"a worker for {model}",
            )
        finally:
            client.close()

    def log_text(self) -> str:
        return "\n".join(f"== {p.name}\n{p.read_text(errors='replace')[-4000:]}" for p in self.logs)

    def stop_all(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self.procs.clear()


@contextmanager
def serving(stack: Stack) -> Iterator[Stack]:
    """Stop every process and Redis afterwards; print the logs if setting up failed."""
    try:
        yield stack
    except BaseException:
        print(stack.log_text())
        raise
    finally:
        stack.stop_all()
        stack.redis_server.stop()


def _ready(base: str) -> bool:
    try:
        return httpx.get(f"{base}/readyz", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


def new_stack(
    tmp: Path,
    appendonly: bool = False,
    redis_options: Iterable[str] = (),
    server: RedisServer | None = None,
    redis_url: str | None = None,
    **env_overrides: str,
) -> Stack:
    """A stack on a private Redis of its own, or on ``server`` (reached by ``redis_url``, e.g. a Sentinel group's)."""
    if server is None:
        server = RedisServer(tmp / "redis", appendonly=appendonly, options=tuple(redis_options))
        server.start()
    models_dir = make_models_dir(tmp / "models")
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("INFERQ_")} | {
        "INFERQ_REDIS_URL": redis_url or server.url,
        "INFERQ_MODELS_DIR": str(models_dir),
        "INFERQ_PORT": str(port),
        "INFERQ_WEBHOOK_SECRET": WEBHOOK_SECRET,
        "INFERQ_WEBHOOK_RETRY_DELAYS_S": "[1, 1, 2, 2, 2]",
        # The tests' webhook receivers listen on loopback, which inferq refuses by default.
        "INFERQ_WEBHOOK_ALLOW": "127.0.0.1",
        "PYTHONPATH": str(ROOT),
        **env_overrides,
    }
    return Stack(tmp, server, models_dir, port, env)
