"""``inferq up``: Redis (unless INFERQ_REDIS_URL names one), the API, a worker per model and a webhook sender per
Redis, supervised on this host, and the banner that says where each is and how to look inside."""

from __future__ import annotations

import argparse
import functools
import logging
import os
import shlex
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from inferq.shared.connections import redact
from inferq.shared.errors import ConfigError
from inferq.shared.settings import Settings

if TYPE_CHECKING:
    from inferq.shared.models import ModelRepository
    from inferq.shared.redis_server import RedisServer

log = logging.getLogger("inferq")


def cmd_up(args: argparse.Namespace) -> int:
    from inferq.cli import settings_of
    from inferq.leftovers import clear_leftovers
    from inferq.shared import connections, keys, shards
    from inferq.shared.models import load_model_configs
    from inferq.shared.redis_server import RedisServer, port_in_use
    from inferq.supervisor import Child, Supervisor
    from inferq.workers.outage import Outage

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
        for shard, url in ({**settings.redis_urls(), shards.DEFAULT: redis_url}).items():
            with connections.connect(url, settings.redis_timeout_s) as connection:
                placed = [keys.queue_name(n) for n, c in configs.items() if (c.redis or shards.DEFAULT) == shard]
                # An external Redis that is down, full or busy is waited for (and said), not a crash at start.
                clear = functools.partial(clear_leftovers, connection, placed)
                cleared = Outage(f"inferq up (Redis {shard})").wait(clear, "starting")
            if cleared.workers or cleared.scheduler_locks:
                log.info(
                    "cleared what a run that did not stop left in %s: workers %s, scheduler locks %s",
                    "Redis" if shard == shards.DEFAULT else f"Redis {shard}",
                    ", ".join(sorted(cleared.workers)) or "none",
                    ", ".join(cleared.scheduler_locks) or "none",
                )
    except BaseException:
        if server is not None:
            server.stop()
        raise
    me = [sys.executable, "-m", "inferq", "--log-level", args.log_level]
    workers = [Child(f"worker {name}", [*me, "worker", "--model", name]) for name in configs]
    services = [
        Child("api", [*me, "api", "--host", settings.host, "--port", str(settings.port)]),
        *(
            Child("webhooks" if shard == shards.DEFAULT else f"webhooks {shard}", [*me, "webhooks", "--redis", shard])
            for shard in sorted({c.redis or shards.DEFAULT for c in configs.values()} | {shards.DEFAULT})
        ),
    ]
    watch = functools.partial(_wanted_workers, settings, me) if settings.models_poll_s else None
    supervisor = Supervisor(
        workers, services, env, server, stop_grace_s=args.stop_grace_s, watch=watch, watch_s=settings.models_poll_s
    )
    print_banner(settings, redis_url, configs, server, args.stop_grace_s)
    code = supervisor.run()
    print("inferq stopped.", flush=True)
    return code


def _wanted_workers(settings: Settings, me: list[str]) -> dict[str, tuple[list[str], Any]]:
    """The worker each model version in the repository asks for now, and what changes when the version does (its
    config, and its weights' size and modification time): the supervisor starts, drains and replaces workers by it."""
    from inferq.shared.models import load_model_configs

    wanted = {}
    for name, config in load_model_configs(settings.models_dir, settings.redis_shards).items():
        try:
            stat = config.weights_path.stat()
            weights = (stat.st_size, stat.st_mtime_ns)
        except OSError:
            weights = None
        wanted[f"worker {name}"] = ([*me, "worker", "--model", name], (config.model_dump_json(), weights))
    return wanted


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
