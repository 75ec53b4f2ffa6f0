"""What a run that died without stopping (SIGKILL, a lost machine) left registered in Redis.

A worker that stops cleanly unregisters itself (RQ's ``register_death``) and its scheduler releases
its lock. One that was killed stays listed as a live worker until its hash expires (worker TTL +
60 s), and its scheduler lock holds back scheduled webhook retries for up to a minute. ``inferq up``
clears both at start, before its own children register, for processes of this host that are gone;
another host's workers and schedulers are never touched. Everything goes through RQ's API.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from redis import Redis
from rq.exceptions import SchedulerNotFound
from rq.scheduler import RQScheduler
from rq.scripts import release_lock
from rq.serializers import JSONSerializer
from rq.utils import as_text
from rq.worker import Worker
from rq.worker_registration import clean_worker_registry

from inferq.shared import keys
from inferq.shared.rqjson import JSONJob, JSONQueue

# /proc/stat's boot time has whole seconds; a PID reused this soon after a worker's birth is not plausible.
CLOCK_SLACK_S = 2.0


@dataclass
class Leftovers:
    """What was cleared: worker names and the queues whose scheduler lock was released."""

    workers: list[str] = field(default_factory=list)
    scheduler_locks: list[str] = field(default_factory=list)


def clear_leftovers(connection: Redis, queue_names: Iterable[str] = (), hostname: str | None = None) -> Leftovers:
    """Unregister dead workers and release scheduler locks of dead schedulers on this host.

    ``queue_names``: queues to check besides those RQ knows (a queue no job has reached is not in its list).
    """
    hostname = hostname or socket.gethostname()
    cleared = Leftovers()
    known = JSONQueue.all(connection=connection, job_class=JSONJob, serializer=JSONSerializer)
    names = {queue.name for queue in known} | set(queue_names) | {keys.WEBHOOK_QUEUE}
    queues = [JSONQueue(name, connection=connection) for name in sorted(names)]
    for key in Worker.all_keys(connection=connection):
        # find_by_key drops a key whose hash has expired from rq:workers, and answers None.
        worker = Worker.find_by_key(
            key, connection=connection, job_class=JSONJob, queue_class=JSONQueue, serializer=JSONSerializer
        )
        if worker is None:
            cleared.workers.append(key.removeprefix(Worker.redis_worker_namespace_prefix))
        elif worker.hostname == hostname and worker.pid and not process_alive(worker.pid, worker.birth_date):
            worker.register_death()
            cleared.workers.append(worker.name)
    for queue in queues:
        clean_worker_registry(queue)  # the per-queue sets still naming expired hashes
    for name in sorted(names):
        lock_key = RQScheduler.get_locking_key(name)
        owner: bytes | None = connection.get(lock_key)  # type: ignore[assignment]
        if owner is None:
            continue
        try:
            scheduler = RQScheduler.fetch(as_text(owner), connection)
        except SchedulerNotFound:
            continue  # a scheduler that is starting takes its lock before it writes its hash
        # A scheduler's hash keeps its first created_at across restarts, so only the PID can be checked.
        if scheduler.hostname == hostname and scheduler.pid and not process_alive(scheduler.pid, None):
            if release_lock(connection, lock_key, scheduler.name):
                cleared.scheduler_locks.append(name)
            scheduler.register_death()
    return cleared


def process_alive(pid: int, born_at: datetime | None) -> bool:
    """Whether process ``pid`` runs and, when ``born_at`` is known, is not a later process reusing the PID."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # it exists, and belongs to another user
    state, started_at = _process_stat(pid)
    # A killed process whose parent died too stays a zombie until PID 1 reaps it, which some inits never do.
    if state in ("Z", "X"):
        return False
    return born_at is None or started_at is None or started_at <= born_at.timestamp() + CLOCK_SLACK_S


def _process_stat(pid: int) -> tuple[str | None, float | None]:
    """The process's state letter and when it started (Unix time), from /proc; Nones where there is none."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        boot = next(line for line in Path("/proc/stat").read_text().splitlines() if line.startswith("btime "))
        # The command name (field 2) may hold spaces and parentheses: count from its closing one.
        fields = stat.rsplit(")", 1)[1].split()
        return fields[0], int(boot.split()[1]) + int(fields[19]) / os.sysconf("SC_CLK_TCK")
    except (OSError, StopIteration, ValueError, IndexError):
        return None, None
