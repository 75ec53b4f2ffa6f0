"""RQ with the JSON serializer, and pickle refused.

RQ's default serializer is pickle: loading it from Redis lets anyone who can write to Redis
run code in our processes. Every inferq Queue, Job and Worker uses these JSON classes, and
``refuse_pickle()`` makes RQ's pickle path raise instead of loading.

``rq info`` builds its own pickle Queue; it stays harmless because inferq never stores a
``meta`` dict or a legacy ``result`` field on a job, the only fields it would unpickle.
"""

from __future__ import annotations

from typing import Any, NoReturn, cast

import rq
import rq.job
import rq.queue
import rq.registry
import rq.results
import rq.serializers
from redis import Redis
from rq.job import Job
from rq.queue import Queue
from rq.serializers import DefaultSerializer, JSONSerializer
from rq.utils import import_attribute

from inferq.shared.errors import ConfigError


class PickleRefused(RuntimeError):
    """Raised instead of unpickling anything read from Redis."""


def _refuse(_data: bytes, /, *args: Any, **kwargs: Any) -> NoReturn:
    raise PickleRefused("inferq never loads pickle from Redis; use the JSON serializer")


def refuse_pickle() -> None:
    """Make RQ's pickle serializer raise on load in this process."""
    DefaultSerializer.loads = staticmethod(_refuse)  # type: ignore[assignment]


def _fast_resolve(serializer: Any = None) -> Any:
    # RQ checks every serializer against a runtime Protocol (~30 us) each time it builds a Job,
    # Queue, registry or Result; with JSON everywhere that check dominated the worker's profile.
    return JSONSerializer if serializer is JSONSerializer else _resolve_serializer(serializer)


_resolve_serializer = rq.serializers.resolve_serializer
for _module in (rq.job, rq.queue, rq.registry, rq.results):
    _module.resolve_serializer = _fast_resolve  # type: ignore[attr-defined]


# Top-level packages whose job functions RQ stored before inferq became one package ("workers.tasks.infer",
# "workers.webhooks.deliver" in jobs queued by 0.1.0): their functions live under inferq.<folder> now.
_FOLDERS = ("api.", "shared.", "workers.")


class JSONJob(Job):
    """An RQ job whose default serializer is JSON."""

    def __init__(self, id: str | None = None, connection: Redis | None = None, serializer: Any = None):
        super().__init__(id, connection=connection, serializer=serializer or JSONSerializer)

    @property
    def func(self) -> Any:
        """RQ's own lookup, but a function stored under a server folder's bare name is found in the package."""
        name = self.func_name
        if name is not None and name.startswith(_FOLDERS) and self.instance is None:
            return import_attribute(f"inferq.{name}")
        return super().func


class JSONQueue(Queue):
    """An RQ queue of JSON jobs."""

    job_class = JSONJob

    def __init__(self, name: str = "default", connection: Redis | None = None, **kwargs: Any):
        kwargs.setdefault("serializer", JSONSerializer)
        kwargs.setdefault("job_class", JSONJob)
        super().__init__(name, connection=connection, **kwargs)


# The rq versions whose storage layout (job hash fields, registries, executions, result streams) the
# worker's batch scripts write directly; pyproject pins the same range.
RQ_VERSIONS = ((2, 12), (3, 0))


def check_rq_version(version: str | None = None) -> None:
    """Refuse to start against an rq whose storage layout inferq was not written for."""
    found = version or rq.__version__
    try:
        parts = tuple(int(p) for p in found.split(".")[:2])
    except ValueError:
        raise ConfigError(f"cannot read the installed rq version {found!r}") from None
    low, high = RQ_VERSIONS
    if not low <= parts < high:
        raise ConfigError(
            f"rq {found} is installed; inferq writes RQ's storage layout directly and needs rq >= "
            f"{'.'.join(map(str, low))},< {'.'.join(map(str, high))} (pip install 'rq>=2.12,<3')"
        )


def fetch_job(job_id: str, connection: Redis) -> JSONJob:
    """Job.fetch with the JSON serializer (raises rq.exceptions.NoSuchJobError)."""
    return cast(JSONJob, JSONJob.fetch(job_id, connection=connection, serializer=JSONSerializer))
