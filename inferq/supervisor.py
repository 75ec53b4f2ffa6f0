"""``inferq up``'s supervisor: its children, their restarts, and the order they stop in.

Every child runs in its own session, so a terminal's Ctrl-C reaches only the supervisor, which
then stops them in order: workers first (the first SIGTERM lets a worker finish and store its
batch), then the API and the webhook sender, and Redis last, so nothing loses Redis mid-write.

A child that exits is started again, always: the pause before a restart doubles with each exit in a
minute, up to ``MAX_BACKOFF_S``, and the log says when the next try comes. The one exception is exit
status 78 (a broken model or setting: its own line says why, and a restart would not change it); the
rest keep serving. Redis itself (when ``inferq up`` started it) is restarted the same way.

With a ``watch`` it follows the model repository: a worker for each new model or version, a drain for a removed
one, and for one that changed a new worker started beside the serving one, which drains only once the new one
tells (on a pipe) that it takes jobs; a new one that cannot load (exit 78) leaves the serving one as it was, and
one killed while it loads (a signal: the kernel's OOM killer, say) is tried again, backing off. A version whose
config turned invalid keeps its worker (``WantedWorkers.invalid``): the last good config serves until it is fixed.
A draining worker that exits while jobs are left in its queues (``left``: it was killed, or a job came in after it
looked) is started again as a drainer (``Child.drain``) until they are served: nothing acknowledged is left
without a worker.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import FrameType
from typing import Any

from inferq.shared.errors import EXIT_CONFIG
from inferq.shared.redis_server import RedisServer, RedisServerError, die_with_parent

log = logging.getLogger("inferq")
# The environment variable that carries a replacement worker's end of its ready pipe (inferq/cli.py writes to it);
# not an INFERQ_ name, which the settings would warn of as unknown.
READY_FD = "_INFERQ_READY_FD"
# And the one that carries a drainer's version config, as the worker it replaces served it (a version removed from the
# repository is no longer there to read).
DRAIN_CONFIG = "_INFERQ_DRAIN_CONFIG"
# Exits within this window count towards the pause before the next restart: 0 s, 1 s, 2 s, 4 s... up to
# MAX_BACKOFF_S. A child that stayed up for a whole window starts over from 0 s.
RESTART_WINDOW_S = 60.0
MAX_BACKOFF_S = 30.0
# How long a stage may take to stop after its second SIGTERM (or second Ctrl-C) before it is killed.
HURRY_S = 10.0
# The API and the webhook sender: an attempt in flight is bounded by INFERQ_WEBHOOK_TIMEOUT_S.
SERVICE_GRACE_S = 15.0
POLL_S = 0.1
# RQ ignores a second stop signal that comes less than a second after the first.
SIGNAL_GAP_S = 1.1


@dataclass
class Child:
    """One supervised process, named by what it is: ``api``, ``worker digits``, ``webhooks``."""

    name: str
    command: list[str]
    proc: subprocess.Popen[bytes] | None = None
    exits: deque[float] = field(default_factory=deque)
    restart_at: float | None = None
    # Why it is not restarted (it could not start as configured), or None.
    stopped_for: str | None = None
    # Told to serve what waits in its queues and exit (its model left the repository, or changed): restarted only as
    # a drainer, while jobs are left in its queues that no other worker serves.
    draining: bool = False
    # How to start a worker that only serves what waits in this one's queues, then exits: its command and the
    # environment it adds (the version's config as it served it: the repository may have lost it). None: none.
    drain: tuple[list[str], dict[str, str]] | None = None
    # The environment this child adds to the supervisor's (a drainer's).
    env: dict[str, str] = field(default_factory=dict)
    # A worker for a model that changed, started beside the one it replaces (``replaces``), which serves until this
    # one tells it takes jobs (a line on the pipe whose read end is ``ready_fd``); if it cannot start, the old one
    # keeps serving the model as it was.
    replaces: Child | None = None
    ready_fd: int | None = None

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


class WantedWorkers(dict[str, tuple[list[str], Any]]):
    """What a ``watch`` reads from the model repository: each worker it asks for now, by name, with its command and
    what changes when its model does; ``invalid``: the workers of versions whose config is invalid now (their
    running worker serves on, with the config it had), with why; ``drains``: how to start a drainer of each
    (``Child.drain``)."""

    def __init__(
        self,
        wanted: Mapping[str, tuple[list[str], Any]],
        invalid: Mapping[str, str] | None = None,
        drains: Mapping[str, tuple[list[str], dict[str, str]]] | None = None,
    ) -> None:
        super().__init__(wanted)
        self.invalid = dict(invalid or {})
        self.drains = dict(drains or {})


class Supervisor:
    """Runs ``workers`` and ``services`` (API, webhooks) against ``redis`` (None: an external Redis).

    ``left``: how many jobs are left in a worker's queues, by its name (waiting, taken or running; None when that
    cannot be read now): a draining worker that exits with some left is started again as a drainer."""

    def __init__(
        self,
        workers: Sequence[Child],
        services: Sequence[Child],
        env: dict[str, str],
        redis: RedisServer | None,
        stop_grace_s: float,
        max_backoff_s: float = MAX_BACKOFF_S,
        watch: Callable[[], Mapping[str, tuple[list[str], Any]]] | None = None,
        watch_s: float = 2.0,
        left: Callable[[str], int | None] | None = None,
    ) -> None:
        self.workers = list(workers)
        self.left = left
        # The workers whose version's config is invalid now, with the reason last said.
        self._invalid: dict[str, str] = {}
        # The worker children the model repository asks for now: name -> (command, what changes when its model
        # does). Read every ``watch_s``: new ones start, removed ones drain, changed ones are replaced.
        self.watch = watch
        self.watch_s = watch_s
        self._wanted: dict[str, Any] = {}
        self._next_watch = 0.0
        self.services = list(services)
        self.env = env
        self.redis = redis
        self.stop_grace_s = stop_grace_s
        self.max_backoff_s = max_backoff_s
        self.signals = 0
        self.exit_code = 0
        self._redis_exits: deque[float] = deque()
        self._redis_restart_at: float | None = None

    @property
    def children(self) -> list[Child]:
        return [*self.workers, *self.services]

    def request_stop(self, signum: int, frame: FrameType | None) -> None:
        """SIGINT/SIGTERM: the first stops everything in order; a second hurries the workers."""
        self.signals += 1

    def run(self) -> int:
        """Start every child, keep them running until a signal (or nothing is left), then stop in order."""
        signal.signal(signal.SIGINT, self.request_stop)
        signal.signal(signal.SIGTERM, self.request_stop)
        try:
            for child in self.children:
                self._start(child)
            if self.watch is not None:
                self._wanted = {name: signature for name, (_, signature) in self.watch().items()}
                self._next_watch = time.monotonic() + self.watch_s
            while not self.signals:
                if self.watch is not None and time.monotonic() >= self._next_watch:
                    self._follow_repository()
                if not self._tend():
                    break
                time.sleep(POLL_S)
        finally:
            self.stop()
        return self.exit_code

    def stop(self) -> None:
        """Workers first (their batches finish and are stored), then the API and webhooks, then Redis."""
        running = [c for c in self.workers if c.running]
        if running:
            log.info("stopping %s: running batches finish first", ", ".join(c.name for c in running))
        self._stop_stage(running, self.stop_grace_s, batches=True)
        self._stop_stage([c for c in self.services if c.running], SERVICE_GRACE_S, batches=False)
        if self.redis is not None:
            self.redis.stop()

    def _follow_repository(self) -> None:
        """Start the workers of new models and versions, drain those of removed ones, replace those that changed:
        a replacement loads beside the running worker, which drains only once the new one takes jobs."""
        assert self.watch is not None
        self._next_watch = time.monotonic() + self.watch_s
        try:
            wanted = self.watch()
        except Exception as exc:  # a half-written config: the next look tries again
            log.warning("the model repository could not be read (%s); keeping the workers as they are", exc)
            return
        current = {c.name: c for c in self.workers if not c.draining and c.replaces is None}
        pending = {c.name: c for c in self.workers if c.replaces is not None}
        invalid = wanted.invalid if isinstance(wanted, WantedWorkers) else {}
        drains = wanted.drains if isinstance(wanted, WantedWorkers) else {}
        for name in [n for n in self._invalid if n not in invalid]:
            del self._invalid[name]
            if name not in wanted:
                continue  # gone: drained below
            log.info("%s: its config is valid again", name)
            stopped = current.get(name)
            if stopped is not None and stopped.stopped_for and not stopped.running:  # it exited on the invalid one
                stopped.stopped_for = None
                self._start(stopped)
        for name, (command, signature) in wanted.items():
            for child in (current.get(name), pending.get(name)):
                if child is not None:
                    child.drain = drains.get(name, child.drain)
            if self._wanted.get(name) == signature and (name in current or name in pending):
                continue
            child = Child(name, command, drain=drains.get(name))
            if name in pending:  # changed again while its replacement loaded: that one loads what is gone
                outdated = pending[name]
                child.replaces = outdated.replaces
                self._abandon(outdated, "its model changed again while it loaded")
                log.info("%s: its model changed again; a new worker loads it", name)
            elif name in current and current[name].running:
                child.replaces = current[name]
                log.info("%s: its model changed; a new worker loads it, the running one serves until it is ready", name)
            elif name in current:
                self._drain(current[name], "its model changed")  # not running (it could not start): nothing waits
                log.info("%s: its model changed, starting it", name)
            else:
                log.info("%s: new in the model repository, starting it", name)
            self.workers.append(child)
            self._start(child)
            self._wanted[name] = signature
        for name in (set(current) | set(pending)) - set(wanted):
            if name in invalid:  # a typo in a serving model's config must not take it offline
                if self._invalid.get(name) != invalid[name]:
                    self._invalid[name] = invalid[name]
                    log.warning(
                        "%s: its config is invalid now (%s); the running worker serves on with the config it had",
                        name,
                        invalid[name],
                    )
                continue
            if name in pending:
                self._abandon(pending[name], "its model left the repository")
            if name in current:
                self._drain(current[name], "its model left the repository")
            self._wanted.pop(name, None)

    def _abandon(self, child: Child, why: str) -> None:
        """Stop a replacement that does not take jobs yet (nothing of it to drain)."""
        self._close_ready(child)
        child.replaces = None
        child.draining = True
        child.drain = None  # it took no job: the worker it replaced drains what waits
        child.restart_at = None  # a try again that was due
        if child.running:
            assert child.proc is not None
            log.info("%s: the worker loading it stops (%s)", child.name, why)
            child.proc.terminate()

    def _close_ready(self, child: Child) -> None:
        if child.ready_fd is not None:
            os.close(child.ready_fd)
            child.ready_fd = None

    def _tend_replacements(self, now: float) -> None:
        """A replacement that tells it is ready has the worker it replaces drain; one that exits before has it
        serve on: for good when it could not load (exit 78, its error said), else (a signal, a crash: no error of
        its own) while it is tried again, backing off."""
        for child in [c for c in self.workers if c.replaces is not None and c.restart_at is None]:
            assert child.replaces is not None
            told = b""
            if child.ready_fd is not None:
                try:
                    told = os.read(child.ready_fd, 64)
                except BlockingIOError:
                    told = b""
            if b"ready" in told:
                log.info(
                    "%s: the new worker takes jobs; the one it replaces serves its batch in hand, then stops",
                    child.name,
                )
                self._close_ready(child)
                old, child.replaces = child.replaces, None
                self._drain(old, "a new worker for its changed model took over")
            elif not child.running:
                assert child.proc is not None
                code = child.proc.returncode
                self._close_ready(child)
                if code == EXIT_CONFIG:
                    log.error(
                        "%s: the new worker for its changed model could not start (its error is above); the running "
                        "one keeps serving the model as it was",
                        child.name,
                    )
                    child.replaces = None
                    self.workers.remove(child)
                    continue
                delay_s = _pause_s(child.exits, now, self.max_backoff_s)
                log.warning(
                    "%s: the new worker for its changed model %s while it loaded, with no error of its own (killed "
                    "from outside, or out of memory); trying it again in %g s, the running one serves until then",
                    child.name,
                    _ended(code),
                    delay_s,
                )
                child.restart_at = now + delay_s

    def _drain(self, child: Child, why: str) -> None:
        """Have a worker serve what waits in its queues, then exit (SIGUSR1); it is restarted only as a drainer, if it
        exits with jobs left that no other worker serves (``_drained``)."""
        child.draining = True
        if child.running:
            assert child.proc is not None
            log.info("%s: %s; it serves its queued jobs, then stops", child.name, why)
            child.proc.send_signal(signal.SIGUSR1)

    def _drained(self, child: Child, now: float) -> None:
        """A draining worker exited: forget it once nothing is left in its queues that no other worker serves, else
        start it again as a drainer (after its pause), which serves them, then exits."""
        others = [
            c
            for c in self.workers
            if c is not child and c.name == child.name and (not c.draining or c.running or c.restart_at is not None)
        ]
        assert child.proc is not None
        code = child.proc.returncode
        left = self.left(child.name) if self.left is not None and child.drain is not None and not others else 0
        if not left:
            log.info("%s: drained and stopped", child.name)
            self.workers.remove(child)
            return
        assert child.drain is not None
        if code == EXIT_CONFIG and child.command == child.drain[0]:
            log.error(
                "%s: a worker to serve the %s job(s) left in its queues could not start (its error is above); they "
                "wait until one does",
                child.name,
                left,
            )
            self.workers.remove(child)
            return
        delay_s = _pause_s(child.exits, now, self.max_backoff_s)
        count = "an unknown number of" if left is None else str(left)  # None: Redis could not be read
        log.warning(
            "%s %s while draining, with %s job(s) left in its queues; a worker starts in %g s to serve them, then "
            "stops",
            child.name,
            _ended(code),
            count,
            delay_s,
        )
        child.command, child.env = child.drain
        child.restart_at = now + delay_s

    def _start(self, child: Child) -> None:
        child.restart_at = None
        env = {**self.env, **child.env} if child.env else self.env
        keep: tuple[int, ...] = ()
        if child.replaces is not None:
            read, write = os.pipe()
            os.set_blocking(read, False)
            child.ready_fd, env, keep = read, {**env, READY_FD: str(write)}, (write,)
        # Own session: the terminal's Ctrl-C is ours alone; die_with_parent: a killed supervisor takes them along.
        try:
            child.proc = subprocess.Popen(
                child.command, env=env, start_new_session=True, preexec_fn=die_with_parent, pass_fds=keep
            )
        finally:
            for fd in keep:
                os.close(fd)

    def _tend(self) -> bool:
        """Restart what exited, after its pause; False when nothing can serve any more."""
        now = time.monotonic()
        self._tend_replacements(now)
        if self.redis is not None and not self.redis.is_running() and not self._tend_redis(now):
            return False
        for child in [c for c in self.workers if c.draining and not c.running and c.restart_at is None]:
            self._drained(child, now)
        for child in self.children:
            if child.stopped_for or child.running:
                continue
            if child.restart_at is not None:
                if now >= child.restart_at:
                    self._start(child)
                continue
            assert child.proc is not None
            code = child.proc.returncode
            if code == EXIT_CONFIG:
                child.stopped_for = "could not start (its error is above)"
                log.error(
                    "%s could not start (its error is above); not restarting it, the rest keep serving", child.name
                )
                continue
            delay_s = _pause_s(child.exits, now, self.max_backoff_s)
            # A crashed worker's jobs come back through RQ's abandoned-job retries.
            if len(child.exits) >= 3:
                log.warning(
                    "%s exited %d times within %g s (last status %s); restarting it in %g s",
                    child.name,
                    len(child.exits),
                    RESTART_WINDOW_S,
                    code,
                    delay_s,
                )
            else:
                log.warning("%s exited with status %s; restarting it in %g s", child.name, code, delay_s)
            child.restart_at = now + delay_s
        if all(child.stopped_for for child in self.children):
            log.error("nothing can run as configured; stopping")
            self.exit_code = EXIT_CONFIG
            return False
        return True

    def _tend_redis(self, now: float) -> bool:
        """Start Redis again after its pause; False only when its binary or data cannot start at all."""
        assert self.redis is not None
        if self._redis_restart_at is None:
            delay_s = _pause_s(self._redis_exits, now, self.max_backoff_s)
            port = self.redis.port
            log.warning("redis exited; restarting it on port %s in %g s (its AOF keeps the data)", port, delay_s)
            self._redis_restart_at = now + delay_s
        if now < self._redis_restart_at:
            return True
        self._redis_restart_at = None
        try:
            self.redis.start()
        except RedisServerError as exc:
            log.error("redis could not restart: %s; stopping", exc)
            self.exit_code = 1
            return False
        return True

    def _stop_stage(self, children: list[Child], grace_s: float, *, batches: bool) -> None:
        """SIGTERM, wait up to grace_s (or a second Ctrl-C), SIGTERM again, wait HURRY_S, then SIGKILL."""
        if not children:
            return
        for child in children:
            assert child.proc is not None
            child.proc.send_signal(signal.SIGTERM)
        first_at = time.monotonic()
        deadline = first_at + grace_s
        signals_seen = self.signals
        hurried = told = False
        while any(child.running for child in children):
            now = time.monotonic()
            hurry_asked = self.signals > signals_seen
            if not hurried and (now >= deadline or hurry_asked) and now - first_at >= SIGNAL_GAP_S:
                hurried = True
                deadline = now + HURRY_S
                what = "putting running batches back in their queues" if batches else "closing open requests"
                log.warning("stopping %s now: %s", ", ".join(c.name for c in children if c.running), what)
                for child in children:
                    if child.running:
                        assert child.proc is not None
                        child.proc.send_signal(signal.SIGTERM)
            elif hurried and now >= deadline:
                for child in children:
                    if child.running:
                        assert child.proc is not None
                        log.error("%s did not stop; killing it", child.name)
                        child.proc.kill()
                break
            elif batches and not told and now - first_at >= 2.0:
                told = True
                log.info("waiting up to %g s for running batches (Ctrl-C again: put them back and stop now)", grace_s)
            time.sleep(POLL_S / 2)
        for child in children:
            assert child.proc is not None
            child.proc.wait()


def _ended(code: int | None) -> str:
    """How a child ended, as the log says it: ``was killed by SIGKILL``, ``exited with status 3``."""
    if code is not None and code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with status {code}"


def _pause_s(exits: deque[float], now: float, cap_s: float) -> float:
    """Note an exit at ``now``; the pause before the restart: 0 s for the first exit in a window, then doubling."""
    exits.append(now)
    while exits and now - exits[0] > RESTART_WINDOW_S:
        exits.popleft()
    return 0.0 if len(exits) == 1 else min(cap_s, 2.0 ** (len(exits) - 2))
