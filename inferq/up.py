"""``inferq up``: Redis (unless INFERQ_REDIS_URL names one), the API, a worker per model and a webhook sender per
Redis, supervised on this host, and the banner that says where each is and how to look inside."""

from __future__ import annotations

import argparse
import functools
import logging
import os
import shlex
import sys
import threading
from pathlib import Path
from typing import TYPE_CHECKING

from inferq.shared.connections import redact
from inferq.shared.errors import ConfigError
from inferq.shared.settings import Settings
from inferq.shared.shards import DEFAULT as DEFAULT_SHARD

if TYPE_CHECKING:
    from inferq.shared.models import ModelConfig, ModelRepository
    from inferq.shared.redis_server import RedisServer
    from inferq.supervisor import WantedWorkers

log = logging.getLogger("inferq")


def cmd_up(args: argparse.Namespace) -> int:
    from inferq.cli import settings_of
    from inferq.shared import shards
    from inferq.shared.models import load_model_configs
    from inferq.shared.redis_server import RedisServer, port_in_use
    from inferq.supervisor import Child, Supervisor

    settings = settings_of(args)
    configs = load_model_configs(settings.models_dir, settings.redis_shards)
    env = dict(os.environ)
    server = None
    if not settings.redis_url:
        # Named in the data's lock file: a second `up` on this data refuses with this line.
        owner = f"inferq up (pid {os.getpid()}, API http://{settings.host}:{settings.port})"
        server = RedisServer(settings.data_dir / "redis", appendonly=True, stable_port=True, owner=owner)
        server.start()
        env["INFERQ_REDIS_URL"] = server.url
    redis_url = env["INFERQ_REDIS_URL"]
    try:
        # Checked after the data's lock, which names the instance that holds the port when it is this folder's.
        if settings.port and port_in_use(settings.host, settings.port):
            raise ConfigError(
                f"the API's address {settings.host}:{settings.port} is taken by another program; stop it, "
                "or give inferq another port (--port or INFERQ_PORT)"
            )
        for shard, url in sorted({**settings.redis_urls(), shards.DEFAULT: redis_url}.items()):
            placed = [n for n, c in configs.items() if (c.redis or shards.DEFAULT) == shard]
            clear = functools.partial(_clear_leftovers, shard, url, placed, settings.redis_timeout_s)
            if shard == shards.DEFAULT:
                clear(wait=True)  # an external Redis that is down, full or busy is waited for (and said): all need it
            elif not clear(wait=False):
                # Only its own models need it: everything else starts, and they wait for it as any outage.
                log.warning(
                    "Redis %s is unavailable: its models (%s) and its webhook sender start and wait for it, the rest "
                    "serve; what a run that did not stop left in it is cleared once it answers",
                    shard,
                    ", ".join(placed) or "none",
                )
                threading.Thread(target=clear, kwargs={"wait": True}, name=f"clear Redis {shard}", daemon=True).start()
    except BaseException:
        if server is not None:
            server.stop()
        raise
    me = [sys.executable, "-m", "inferq", "--log-level", args.log_level]
    repository = Repository(settings, me, redis_url)
    workers = [
        Child(f"worker {name}", repository.command(name), drain=repository.drain(config))
        for name, config in configs.items()
    ]
    services = [
        Child("api", [*me, "api", "--host", settings.host, "--port", str(settings.port)]),
        *(
            Child("webhooks" if shard == shards.DEFAULT else f"webhooks {shard}", [*me, "webhooks", "--redis", shard])
            for shard in sorted({c.redis or shards.DEFAULT for c in configs.values()} | {shards.DEFAULT})
        ),
    ]
    supervisor = Supervisor(
        workers,
        services,
        env,
        server,
        stop_grace_s=args.stop_grace_s,
        watch=repository.wanted if settings.models_poll_s else None,
        watch_s=settings.models_poll_s,
        left=repository.left,
    )
    print_banner(settings, redis_url, configs, server, args.stop_grace_s)
    code = supervisor.run()
    print("inferq stopped.", flush=True)
    return code


def _clear_leftovers(shard: str, url: str, models: list[str], timeout_s: float, *, wait: bool) -> bool:
    """Clear what a run that did not stop left in Redis ``shard`` (inferq/leftovers.py), waiting for it through an
    outage, or not (``wait``): False when it could not be read, then."""
    from redis.exceptions import RedisError

    from inferq.leftovers import clear_leftovers
    from inferq.shared import connections, keys, shards
    from inferq.workers.outage import Outage

    with connections.connect(url, timeout_s) as connection:
        clear = functools.partial(clear_leftovers, connection, [keys.queue_name(n) for n in models])
        if wait:
            cleared = Outage(f"inferq up (Redis {shard})").wait(clear, "starting")
        else:
            try:
                cleared = clear()
            except RedisError as exc:
                if not connections.is_unavailable(exc):
                    raise
                return False
    if cleared.workers or cleared.scheduler_locks:
        log.info(
            "cleared what a run that did not stop left in %s: workers %s, scheduler locks %s",
            "Redis" if shard == shards.DEFAULT else f"Redis {shard}",
            ", ".join(sorted(cleared.workers)) or "none",
            ", ".join(cleared.scheduler_locks) or "none",
        )
    return True


class Repository:
    """The model repository and its Redis as the supervisor asks of them: the workers it wants now (``wanted``), and
    the jobs left in a worker's queues (``left``), read on the Redis of the version it served."""

    def __init__(self, settings: Settings, me: list[str], redis_url: str) -> None:
        self.settings = settings
        self.me = me
        self.urls = {**settings.redis_urls(), DEFAULT_SHARD: redis_url}  # INFERQ_REDIS_URL's: the one `up` started
        # Each worker's version's Redis, as last read: kept once the version leaves, for its queues may hold jobs.
        self._shard: dict[str, str] = {}

    def command(self, served: str) -> list[str]:
        return [*self.me, "worker", "--model", served]

    def drain(self, config: ModelConfig) -> tuple[list[str], dict[str, str]]:
        """A drainer of ``config``'s version: it serves what waits in its queues, then exits (inferq/cli.py)."""
        from inferq.supervisor import DRAIN_CONFIG

        self._shard[f"worker {config.served}"] = config.redis or DEFAULT_SHARD
        return [*self.command(config.served), "--drain"], {DRAIN_CONFIG: config.model_dump_json()}

    def wanted(self) -> WantedWorkers:
        """The worker each model version in the repository asks for now, and what changes when the version does
        (its config, and its weights' size and modification time): the supervisor starts, drains and replaces
        workers by it; and the versions whose config is invalid now."""
        from inferq.shared.models import load_model_configs
        from inferq.supervisor import WantedWorkers

        configs = load_model_configs(self.settings.models_dir, self.settings.redis_shards)
        wanted = {}
        for name, config in configs.items():
            try:
                stat = config.weights_path.stat()
                weights = (stat.st_size, stat.st_mtime_ns)
            except OSError:
                weights = None
            wanted[f"worker {name}"] = (self.command(name), (config.model_dump_json(), weights))
        drains = {f"worker {name}": self.drain(config) for name, config in configs.items()}
        return WantedWorkers(wanted, {f"worker {n}": error for n, error in configs.invalid.items()}, drains)

    def left(self, worker: str) -> int | None:
        """The jobs left in the queues of the version ``worker`` served (None: its Redis cannot be read now)."""
        from redis.exceptions import RedisError

        from inferq.shared import connections
        from inferq.shared.lifecycle import census

        url = self.urls[self._shard.get(worker, DEFAULT_SHARD)]
        try:
            with connections.connect(url, self.settings.redis_timeout_s) as connection:
                return census.unfinished(connection, worker.removeprefix("worker "))
        except RedisError as exc:
            log.warning("%s: the jobs left in its queues could not be counted (%s)", worker, exc)
            return None


def print_banner(
    settings: Settings, redis_url: str, configs: ModelRepository, server: RedisServer | None, grace_s: float
) -> None:
    base = f"http://{settings.host}:{settings.port}"
    # Commands that work as pasted: the venv's own tools, and the URL itself unless it carries a password.
    url = redis_url if redact(redis_url) == redis_url else '"$INFERQ_REDIS_URL"'
    lines = [
        "inferq is up",
        f"  API:     {base}  (docs: {base}/docs)",
        f"  Redis:   {redact(redis_url)}" + (f"  (its data and port stay in {server.data_dir})" if server else ""),
        f"  models:  {', '.join(configs) or 'none'}",
        *(f"  left out: {name}: {error}" for name, error in configs.invalid.items()),
        f"  queues:  {_rq_info(redis_url, url)}",
    ]
    # rq-dashboard binds every interface by default, and it has no login yet can requeue and delete jobs.
    dashboard = f"--redis-url {url} --json --bind 127.0.0.1"
    if _tool("rq-dashboard") != "rq-dashboard":
        lines.append(f"  dashboard: {_tool('rq-dashboard')} {dashboard}, then http://127.0.0.1:9181")
    else:
        lines.append(f"  dashboard: {_tool('pip')} install rq-dashboard; then rq-dashboard {dashboard}")
    lines.append(
        f"Ctrl-C stops everything; running batches get up to {grace_s:g} s to finish (Ctrl-C again: stop now)."
    )
    print("\n".join(lines), flush=True)


def _rq_info(redis_url: str, shown: str) -> str:
    """The ``rq info`` command for this Redis: ``-u`` takes a plain URL; a Sentinel group needs rq's config module."""
    from inferq.shared.connections import parse

    if not parse(redis_url).is_sentinel:
        return f"{_tool('rq')} info -u {shown}"
    value = shown if shown.startswith('"') else shlex.quote(shown)
    return f"INFERQ_REDIS_URL={value} {_tool('rq')} info -c inferq.rqconfig"


def _tool(name: str) -> str:
    """The command for a tool beside this Python (``.venv/bin/rq`` from the repository root), else its bare name."""
    path = Path(sys.executable).parent / name
    if not path.exists():
        return name
    cwd = Path.cwd()
    shown = str(path.relative_to(cwd)) if path.is_relative_to(cwd) else str(path)
    return shlex.quote(shown if "/" in shown else f"./{shown}")
