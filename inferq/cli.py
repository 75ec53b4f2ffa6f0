"""``inferq``: run the API, the workers, the webhook sender, or all of them with Redis."""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from shared.errors import AppError, ConfigError
from shared.settings import Settings, get_settings

log = logging.getLogger("inferq")
STOP_GRACE_S = 15.0
# sysexits' EX_CONFIG: a worker that cannot load its model exits with it, and `inferq up` stops instead of restarting.
EXIT_CONFIG = 78
MAX_RESTARTS = 5
RESTART_WINDOW_S = 60.0


def build_parser() -> argparse.ArgumentParser:
    """The CLI's parser; every option's default comes from an INFERQ_* variable."""
    parser = argparse.ArgumentParser(prog="inferq", description=__doc__)
    parser.add_argument("--log-level", default=os.environ.get("INFERQ_LOG_LEVEL", "INFO"))
    sub = parser.add_subparsers(dest="command", required=True)

    up = sub.add_parser("up", help="start Redis (unless INFERQ_REDIS_URL), the API, workers and webhooks")
    _add_bind(up)
    api = sub.add_parser("api", help="serve the HTTP API")
    _add_bind(api)

    worker = sub.add_parser("worker", help="run a batching worker for one or more models")
    worker.add_argument("--model", action="append", help="a model to serve (repeat for several; default all)")
    worker.add_argument("--device", help="auto | cpu | cuda | cuda:N (default: the model's config)")
    worker.add_argument("--max-batch", type=int, help="cap on the batch size (default: the model's max_batch)")
    worker.add_argument(
        "--max-wait-ms", type=_max_wait_ms, help="wait up to this long from the first pop to fill a batch (0-60000)"
    )
    worker.add_argument("--burst", action="store_true", help="quit when the queues are empty")
    worker.add_argument("--name", help="worker name (default: unique per process)")

    webhooks = sub.add_parser("webhooks", help="deliver webhooks")
    webhooks.add_argument("--burst", action="store_true", help="quit when the queue is empty")
    webhooks.add_argument("--name", help="worker name (default: unique per process)")

    submit = sub.add_parser("submit", help="submit files to a model through the API")
    submit.add_argument("model")
    submit.add_argument("files", nargs="+", type=Path)
    submit.add_argument("--wait", type=float, default=0.0, help="seconds to wait for each result")
    submit.add_argument("--webhook", help="URL to POST the finished job to")
    submit.add_argument("--api", help="API base URL (default http://INFERQ_HOST:INFERQ_PORT)")

    models = sub.add_parser("models", help="list the models the API serves")
    models.add_argument("--api", help="API base URL (default http://INFERQ_HOST:INFERQ_PORT)")
    return parser


def _max_wait_ms(value: str) -> float:
    """The same bounds as INFERQ_MAX_WAIT_MS: RQ fails a job held popped but unstarted for over a minute."""
    try:
        wait_ms = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {value!r}") from None
    if not 0 <= wait_ms <= 60_000:  # also false for NaN
        raise argparse.ArgumentTypeError(f"must be between 0 and 60000 ms, got {value}")
    return wait_ms


def _add_bind(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host", help="bind address (INFERQ_HOST, default 127.0.0.1)")
    parser.add_argument("--port", type=int, help="port (INFERQ_PORT, default 8000)")


def _settings(args: argparse.Namespace) -> Settings:
    settings = get_settings()
    overrides = {k: getattr(args, k) for k in ("host", "port") if getattr(args, k, None) is not None}
    return settings.model_copy(update=overrides) if overrides else settings


def redact(url: str) -> str:
    """A Redis URL without its password, for printing."""
    parts = urlsplit(url)
    if parts.password:
        netloc = f"{parts.username or ''}:***@{parts.hostname}" + (f":{parts.port}" if parts.port else "")
        return urlunsplit(parts._replace(netloc=netloc))
    return url


def _unique_name(prefix: str) -> str:
    return f"{prefix}.{socket.gethostname()}.{os.getpid()}.{uuid.uuid4().hex[:6]}"


def _require_redis(settings: Settings) -> str:
    if not settings.redis_url:
        raise AppError("INFERQ_REDIS_URL is not set; use `inferq up` to start a private Redis")
    return settings.redis_url


def cmd_api(args: argparse.Namespace) -> int:
    import uvicorn

    from api.app import create_app

    settings = _settings(args)
    _require_redis(settings)
    uvicorn.run(create_app(settings), host=settings.host, port=settings.port, log_level=args.log_level.lower())
    return 0


def cmd_worker(args: argparse.Namespace) -> int:
    from redis import Redis

    from shared.models import load_model_configs
    from shared.rqjson import check_rq_version, refuse_pickle
    from workers.batching import BatchWorker
    from workers.handlers import resolve_device
    from workers.running import load_runner

    settings = get_settings()
    url = _require_redis(settings)
    check_rq_version()
    refuse_pickle()
    configs = load_model_configs(settings.models_dir)
    names = args.model or sorted(configs)
    unknown = [n for n in names if n not in configs]
    if unknown or not names:
        raise AppError(f"unknown model(s) {unknown}; the repository has {sorted(configs)}")
    runners = {}
    for name in names:
        config = configs[name]
        device = resolve_device(args.device or (settings.device if config.device == "auto" else config.device))
        max_batch = min(config.max_batch, args.max_batch or settings.max_batch or config.max_batch)
        runners[name] = load_runner(config, device, max_batch, max_image_pixels=settings.max_image_pixels)
        log.info("model %s (%s) loaded on %s, max batch %d", name, config.format, device, max_batch)
    max_wait_ms = args.max_wait_ms if args.max_wait_ms is not None else settings.max_wait_ms
    worker = BatchWorker(
        runners,
        connection=Redis.from_url(url),
        settings=settings,
        max_wait_ms=max_wait_ms,
        name=args.name or _unique_name("+".join(names)),
    )
    worker.work(burst=args.burst, logging_level=args.log_level)
    return 0


def cmd_webhooks(args: argparse.Namespace) -> int:
    from redis import Redis

    from shared.rqjson import refuse_pickle
    from workers.webhooks import webhook_worker

    settings = get_settings()
    url = _require_redis(settings)
    refuse_pickle()
    worker = webhook_worker(Redis.from_url(url), settings, name=args.name or _unique_name("webhooks"))
    worker.work(burst=args.burst, with_scheduler=True, logging_level=args.log_level)
    return 0


def cmd_up(args: argparse.Namespace) -> int:
    from shared.models import load_model_configs
    from shared.redis_server import RedisServer, die_with_parent

    settings = _settings(args)
    configs = load_model_configs(settings.models_dir)
    env = dict(os.environ)
    server = None
    if not settings.redis_url:
        server = RedisServer(settings.data_dir / "redis", appendonly=True)
        server.start()
        env["INFERQ_REDIS_URL"] = server.url
    redis_url = env["INFERQ_REDIS_URL"]
    me = [sys.executable, "-m", "inferq", "--log-level", args.log_level]

    def label(cmd: list[str]) -> str:
        return " ".join(cmd[len(me) :])  # the subcommand and its options, e.g. "worker --model digits"

    commands = [[*me, "api", "--host", settings.host, "--port", str(settings.port)]]
    commands += [[*me, "worker", "--model", name] for name in configs]
    commands.append([*me, "webhooks"])
    # Own sessions: a terminal's Ctrl-C reaches only us, and we stop the children in order.
    children = [subprocess.Popen(cmd, env=env, start_new_session=True, preexec_fn=die_with_parent) for cmd in commands]
    stopping = False

    def stop(signum: int, _frame: Any) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)
    base = f"http://{settings.host}:{settings.port}"
    print(f"inferq is up\n  API:    {base}  (docs: {base}/docs)\n  Redis:  {redact(redis_url)}")
    print(f"  models: {', '.join(configs) or 'none'}\n  ops:    rq info -u '{redact(redis_url)}'")
    print("Ctrl-C stops everything.", flush=True)
    code = 0
    reason = ""
    restarts: list[float] = []
    try:
        while not stopping:
            for index, (child, cmd) in enumerate(zip(children, commands, strict=True)):
                if child.poll() is None:
                    continue
                if child.returncode == EXIT_CONFIG:
                    # A model that cannot load will not load on a restart either: its line is already printed.
                    reason = f"inferq: {label(cmd)} could not start (see above); stopped"
                    stopping, code = True, EXIT_CONFIG
                    break
                # A crashed worker is replaced: its jobs come back through RQ's abandoned-job retries.
                restarts = [t for t in restarts if time.monotonic() - t < RESTART_WINDOW_S] + [time.monotonic()]
                if len(restarts) > MAX_RESTARTS:
                    log.error("%s keeps exiting (%s); stopping", label(cmd), child.returncode)
                    stopping, code = True, 1
                    break
                log.warning("%s exited with %s; restarting it", label(cmd), child.returncode)
                children[index] = subprocess.Popen(cmd, env=env, start_new_session=True, preexec_fn=die_with_parent)
            time.sleep(0.2)
    finally:
        _stop_children(children)
        if server is not None:
            server.stop()
    print("inferq stopped.", flush=True)
    if reason:
        print(reason, file=sys.stderr, flush=True)  # last, after the children's shutdown lines
    return code


def _stop_children(children: list[subprocess.Popen[bytes]]) -> None:
    for child in children:
        if child.poll() is None:
            child.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + STOP_GRACE_S
    for child in children:
        try:
            child.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()


def _api_base(args: argparse.Namespace) -> str:
    if args.api:
        return str(args.api).rstrip("/")
    settings = get_settings()
    return f"http://{settings.host}:{settings.port}"


def cmd_submit(args: argparse.Namespace) -> int:
    import httpx

    base = _api_base(args)
    failed = 0
    with httpx.Client(timeout=max(30.0, args.wait + 10)) as client:
        for path in args.files:
            data = {"webhook": args.webhook} if args.webhook else {}
            headers = {"Prefer": f"wait={args.wait:g}"} if args.wait else {}
            with path.open("rb") as fh:
                files = {"file": (path.name, fh, "application/octet-stream")}
                response = client.post(f"{base}/v1/models/{args.model}/jobs", files=files, data=data, headers=headers)
            body = response.json()
            failed += response.status_code >= 400 or body.get("status") == "failed"
            print(json.dumps({"file": str(path), "http_status": response.status_code, **body}), flush=True)
    return 1 if failed else 0


def cmd_models(args: argparse.Namespace) -> int:
    import httpx

    response = httpx.get(f"{_api_base(args)}/v1/models", timeout=10)
    response.raise_for_status()
    for model in response.json()["models"]:
        spec = model["input"]
        shape = spec.get("size") or spec.get("shape") or (f"<={spec['max_chars']} chars" if "max_chars" in spec else "")
        print(
            f"{model['name']:<20} {spec['kind']:<7} {shape!s:<16} max_batch={model['max_batch']:<5} "
            f"queued={model['queue_length']}"
        )
    return 0


COMMANDS = {
    "up": cmd_up,
    "api": cmd_api,
    "worker": cmd_worker,
    "webhooks": cmd_webhooks,
    "submit": cmd_submit,
    "models": cmd_models,
}


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        return COMMANDS[args.command](args)
    except ConfigError as exc:
        print(f"inferq: {exc.message}", file=sys.stderr)
        return EXIT_CONFIG
    except AppError as exc:
        print(f"inferq: {exc.message}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
