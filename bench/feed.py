"""``python -m bench.feed``: what feeding a device costs the host, per job, against issue 46's targets.

Each scenario queues single jobs through the real API over HTTP (the load generator of ``bench.generators``,
never counted), then starts one real worker process, suspended by RQ's own switch while it loads its model;
the switch is lifted and the queue drained. Measured over each phase:

- Redis's CPU (``INFO cpu``), its idle CPU over an interval as long right before netted out, and its commands
  (``INFO commandstats``) per job: the submit part and the drain part;
- the API's CPU per submit, and the worker's, every process and thread of it (``bench.cpu``), by thread name
  (the worker runs through ``bench.threadnames``);
- the drain's rate, as Redis stamped its jobs: from the end of the first batch to the end of the last.

The devices are simulated (``bench.simdevice``): an instant one (the host's whole cost) and one taking a set
time per image with no CPU (a GPU's forward, as the host sees it). Workers run as on a GPU: the overlap on, one
torch thread. Each scenario runs ``--rounds`` times (a fresh worker each); each figure keeps its best round.

    python -m bench.feed [--quick] [--only redis_single,worker_cpu] [--rounds N] [--forward thread:MainThread]
"""

from __future__ import annotations

import argparse
import base64
import json
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from io import BytesIO
from pathlib import Path
from typing import Any, cast

import httpx
import numpy as np
import torch
from PIL import Image
from redis import Redis
from rq.suspension import resume, suspend

from bench import cpu
from bench.feedmodels import JPEG_BYTES, MAX_BATCH, SIM_RATES, feed_models, jpeg_of_about, payload
from bench.feedprofile import Sampler, SlowLog
from bench.generators import hammer, pick_tool
from bench.models import ROOT, build_models
from bench.procs import Processes, wait_http
from bench.threadnames import LOG_DIR_ENV
from inferq.shared.keys import queue_name
from inferq.shared.lifecycle import rqhash
from inferq.shared.redis_server import RedisServer, free_port
from inferq.shared.rqjson import JSONQueue
from inferq.workers.feeders import count_for

log = logging.getLogger("bench")
SUBMIT_CLIENTS = 32
# As on a GPU: the next batch prepared while the device runs this one, one torch thread on the host, and the feeders
# a CUDA worker starts by default (workers/feeders.py ``count_for``: the cores it may use).
FEEDERS = count_for("auto", torch.device("cuda"))
WORKER_ENV = {"INFERQ_OVERLAP": "on", "INFERQ_CPU_THREADS": "1", "INFERQ_DEVICE": "cpu", "INFERQ_FEEDERS": str(FEEDERS)}
# The scenarios ``--profile`` profiles in a round of their own after their measured ones: rows 1 and 2's.
PROFILED = ("digits", "text", "jpeg", "noop")
FORWARD = "thread:MainThread"  # where the forward runs in today's worker (``--forward``, ``forward_ns``)


@dataclass(frozen=True)
class Scenario:
    """One kind of job: its model folder and the body each submit sends."""

    name: str
    model: str
    payload: str  # png, text, jpeg, noop


SCENARIOS = {
    "digits": Scenario("digits", "digits", "png"),  # the digits demo model, real (8x8 PNG)
    "text": Scenario("text", "langid", "text"),  # langid, instant device
    "jpeg": Scenario("jpeg", "cnn", "jpeg"),  # the ResNet-sized CNN's preprocessing, instant device
    "noop": Scenario("noop", "noop", "noop"),  # the no-op model: the queue alone
    "sim1000": Scenario("sim1000", "sim1000", "jpeg"),
    "sim2000": Scenario("sim2000", "sim2000", "jpeg"),
}
# Each row of the targets table and the scenarios it reads (``--only``).
ROWS = {
    "redis_single": ("digits", "text", "jpeg"),
    "worker_cpu": ("noop", "jpeg"),
    "sim_device": ("sim1000", "sim2000"),
    "host_capacity": ("jpeg",),
    "text_cpu": ("text",),
    "bulk_upload": (),  # uploads, not submits (``Feed.upload_round``)
}
BULK_LINES = 256  # JPEG lines per upload: 11.5 MB, four chunks of 64


def forward_ns(usage: cpu.TreeUsage, where: str) -> int:
    """The CPU of where the forward runs: ``thread:NAME`` (the worker process's thread of that name; today the
    main thread), ``process:COMM`` (every process of the tree so named, for a worker whose model runs in a
    process of its own)."""
    kind, _, name = where.partition(":")
    if kind == "thread":
        return usage.thread_ns(name)
    if kind == "process":
        return usage.process_ns(name)
    raise ValueError(f"--forward: thread:NAME or process:COMM, got {where!r}")


def drain_span(connection: Redis, model: str) -> dict[str, Any]:
    """The drain's rate as Redis stamped its finished jobs: from the first batch's end to the last's (the start,
    one batch prepared with nothing to overlap, left out), and from the first start to the last end."""
    queue = JSONQueue(queue_name(model), connection=connection)
    found: Any = connection.zrange(queue.finished_job_registry.key, 0, -1)
    ids = [i.decode() for i in found]
    with connection.pipeline(transaction=False) as pipe:
        for job_id in ids:
            pipe.hmget(f"rq:job:{job_id}", ["started_at", "ended_at"])
        stamps = pipe.execute()
    starts = sorted(s.timestamp() for s in (rqhash.parse_stamp(r[0]) for r in stamps) if s is not None)
    ends = sorted(e.timestamp() for e in (rqhash.parse_stamp(r[1]) for r in stamps) if e is not None)
    first_end = ends[0]
    after_first = [end for end in ends if end > first_end]
    steady_s = ends[-1] - first_end
    return {
        "jobs": len(ends),
        "seconds": ends[-1] - starts[0],
        "per_s": len(ends) / max(ends[-1] - starts[0], 1e-9),
        "steady_jobs": len(after_first),
        "steady_s": steady_s,
        "steady_per_s": len(after_first) / steady_s if steady_s > 0 else 0.0,
    }


def preprocess_loop(jpeg: bytes, seconds: float, batch: int = MAX_BATCH) -> float:
    """Images per second of today's preprocessing arithmetic in one thread of one process: Pillow's decode, a
    channel-first normalise into a new array per image, ``torch.stack`` per batch (ImageNet's statistics)."""
    mean = np.asarray([0.485, 0.456, 0.406], dtype=np.float64)
    std = np.asarray([0.229, 0.224, 0.225], dtype=np.float64)
    scale = (1.0 / (255.0 * std)).astype(np.float32).reshape(3, 1, 1)
    shift = (-mean / std).astype(np.float32).reshape(3, 1, 1)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        done, started = 0, time.perf_counter()
        while time.perf_counter() - started < seconds or done < batch:
            items = []
            for _ in range(batch):
                image: Image.Image = Image.open(BytesIO(jpeg))
                image.load()
                if image.mode != "RGB":
                    image = image.convert("RGB")
                pixels = np.asarray(image).transpose(2, 0, 1)
                out = np.empty(pixels.shape, dtype=np.float32)
                np.multiply(pixels, scale, out=out)
                out += shift
                items.append(torch.from_numpy(out))
            torch.stack(items)
            done += batch
        return done / (time.perf_counter() - started)
    finally:
        torch.set_num_threads(threads)


class Feed:
    """One API process on a Redis; scenarios run against it, each round with a worker of its own."""

    def __init__(self, redis: RedisServer, tmp: Path, models_dir: Path, args: argparse.Namespace) -> None:
        self.redis = redis
        self.tmp = tmp
        self.models_dir = models_dir
        self.args = args
        self.connection = Redis.from_url(redis.url)
        self.meter = cpu.RedisMeter(self.connection)
        self.tool = pick_tool(args.loadgen)
        env = {
            "INFERQ_REDIS_URL": redis.url,
            "INFERQ_MODELS_DIR": str(models_dir),
            # Every submit of a phase queued, none expired while it waits for its worker.
            "INFERQ_MAX_QUEUE_LENGTH": "100000000",
            "INFERQ_QUEUE_TTL_S": "3600",
            "INFERQ_RESULT_TTL_S": "3600",
            "INFERQ_FAILURE_TTL_S": "3600",
        }
        self.procs = Processes(tmp, env)
        self.api: Any = None
        self.base = ""

    def __enter__(self) -> Feed:
        port = free_port()
        self.api = self.procs.start("feed-api", "inferq", "--log-level", "WARNING", "api", "--port", str(port))
        self.base = f"http://127.0.0.1:{port}"
        wait_http(f"{self.base}/readyz")
        return self

    def __exit__(self, *exc: object) -> None:
        self.procs.stop()
        self.connection.close()

    def round(self, scenario: Scenario, index: int, profile: bool = False) -> dict[str, Any]:
        """Submit for ``submit_s`` through the API, then drain with a fresh worker: every figure of one round.
        ``profile``: also where the CPU went (``bench.feedprofile``), which costs CPU too: not a measured round."""
        self.connection.flushall()
        body, content_type = payload(scenario.payload)
        submit_s = self.args.submit_s
        queue = JSONQueue(queue_name(scenario.model), connection=self.connection)
        self.meter.measure_idle(submit_s)
        api = cpu.Tree(self.api.pid)
        api.start()
        slowlog = SlowLog(self.connection)
        if profile:
            slowlog.start()
        self.meter.start()
        load = os.getloadavg()[0]
        sent = hammer(
            f"{self.base}/v1/models/{scenario.model}/jobs",
            SUBMIT_CLIENTS,
            submit_s,
            method="POST",
            body=body,
            headers={"content-type": content_type},
            tool=self.tool,
        )
        time.sleep(0.2)  # what a generator left in flight at its deadline is queued or refused by now
        jobs = queue.count
        if jobs == 0:
            raise RuntimeError(f"feed {scenario.name}: no job was queued ({sent.statuses}, {sent.errors})")
        redis_submit = self.meter.stop(jobs)
        api_us = api.stop().total_ns / 1000 / jobs
        if profile:
            redis_submit["profile"] = slowlog.stop(jobs)
        drained = self._drain(scenario, index, jobs, submit_s, profile)
        out = {
            "jobs": jobs,
            "load_average": load,
            "payload_bytes": len(body),
            "submit": {"per_s": sent.per_s, "failed": sent.failed, "redis": redis_submit, "api_us": api_us},
            **drained,
        }
        out["redis_us"] = redis_submit["cpu_us"] + drained["redis"]["cpu_us"]
        out["worker_us"] = drained["worker"]["total_us"]
        log.info(
            "feed %s round %d: %d jobs, Redis %.1f us/job (submit %.1f, drain %.1f), worker %.1f us/job, API %.0f us"
            "/submit, drain %.0f jobs/s",
            scenario.name,
            index,
            jobs,
            out["redis_us"],
            redis_submit["cpu_us"],
            drained["redis"]["cpu_us"],
            out["worker_us"],
            api_us,
            drained["span"]["steady_per_s"],
        )
        self.connection.flushall()
        return out

    def upload_round(self, index: int) -> dict[str, Any]:
        """One bulk upload of ``BULK_LINES`` 34 KB JPEG lines (base64, as `inferq batch` sends them) to the CNN:
        the API's CPU and Redis's per item, from the request's start to its 202 (no worker runs)."""
        self.connection.flushall()
        jpeg = jpeg_of_about(JPEG_BYTES)
        image = base64.b64encode(jpeg).decode()
        body = "".join(
            json.dumps({"custom_id": f"item-{index}-{n}", "image": image}) + "\n" for n in range(BULK_LINES)
        ).encode()
        self.meter.measure_idle(1.0)
        api = cpu.Tree(self.api.pid)
        api.start()
        self.meter.start()
        response = httpx.post(
            f"{self.base}/v1/models/cnn/batches",
            content=body,
            headers={"content-type": "application/x-ndjson"},
            timeout=120,
        )
        redis = self.meter.stop(BULK_LINES)
        api_us = api.stop().total_ns / 1000 / BULK_LINES
        if response.status_code != 202 or response.json().get("counts", {}).get("total", BULK_LINES) != BULK_LINES:
            raise RuntimeError(f"feed bulk upload: {response.status_code} {response.text[:300]}")
        log.info("feed bulk upload round %d: API %.1f us/item, Redis %.1f us/item", index, api_us, redis["cpu_us"])
        self.connection.flushall()
        return {"items": BULK_LINES, "bytes": len(body), "api_us": api_us, "redis_us": redis["cpu_us"]}

    def _drain(self, scenario: Scenario, index: int, jobs: int, idle_s: float, profile: bool) -> dict[str, Any]:
        """A worker started after the queueing, suspended while it loads; measured from its release to the end."""
        name = f"feed-{scenario.name}-{index}-{os.getpid()}"
        threads_log = self.tmp / f"threads-{scenario.name}-{index}"
        threads_log.mkdir(exist_ok=True)
        suspend(self.connection)
        worker = self.procs.start(
            f"feed-worker-{scenario.name}-{index}",
            "bench.threadnames",
            "--log-level",
            "WARNING",
            "worker",
            "--model",
            scenario.model,
            "--name",
            name,
            env={**worker_env(self.args), LOG_DIR_ENV: str(threads_log)},
        )
        try:
            self._wait(lambda: self.connection.hget(f"rq:worker:{name}", "state") == b"suspended", worker, 600)
            self.meter.measure_idle(idle_s)  # Redis beside the API and the suspended worker
            tree = cpu.Tree(worker.pid, log_dir=threads_log)
            tree.start()
            worker_profile: dict[str, Any] = {}
            slowlog, spy = SlowLog(self.connection), Sampler(worker.pid, self.tmp / f"py-spy-{name}.txt")
            if profile:
                slowlog.start()
                spy.start()
            self.meter.start()
            resume(self.connection)
            queue = JSONQueue(queue_name(scenario.model), connection=self.connection)
            ended = (queue.finished_job_registry.key, queue.failed_job_registry.key)
            self._wait(lambda: sum(self._zcard(key) for key in ended) >= jobs, worker, 900, poll_s=0.02)
            usage = tree.stop()
            redis = self.meter.stop(jobs)
            if profile:
                redis["profile"] = slowlog.stop(jobs)
                worker_profile = spy.stop()
        finally:
            worker.terminate()
            worker.wait(60)
        failed = self._zcard(queue.failed_job_registry.key)
        if failed:
            raise RuntimeError(f"feed {scenario.name}: {failed} of {jobs} jobs failed; see {self.tmp}")
        out = {
            "redis": redis,
            "worker": usage.summary(per=jobs),
            # Cores the worker used over the drain: a wall rate short of its device's with the cores far from
            # busy is the host's other work, not the worker's.
            "worker_cores": usage.total_ns / 1e9 / max(usage.seconds, 1e-9),
            "forward_us": forward_ns(usage, self.args.forward) / 1000 / jobs,
            "span": drain_span(self.connection, scenario.model),
        }
        if profile:
            out["worker_profile"] = worker_profile
        return out

    def _zcard(self, key: str) -> int:
        return int(cast(int, self.connection.zcard(key)))

    def _wait(self, done: Callable[[], bool], proc: Any, timeout_s: float, poll_s: float = 0.1) -> None:
        deadline = time.monotonic() + timeout_s
        while not done():
            if proc.poll() is not None:
                raise RuntimeError(f"the feed's worker exited with {proc.returncode}; see its log in {self.tmp}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"the feed's worker did not get there within {timeout_s:.0f} s; see {self.tmp}")
            time.sleep(poll_s)


def best(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """Each figure at its best round: the least CPU per job, the fastest drain; Redis's submit and drain parts
    from the round of the least Redis CPU in all."""
    fastest = max(rounds, key=lambda r: r["span"]["steady_per_s"])
    cheapest = min(rounds, key=lambda r: r["redis_us"])
    return {
        "redis_us": cheapest["redis_us"],
        # Its parts from the same round, so they add up to it.
        "redis_submit_us": cheapest["submit"]["redis"]["cpu_us"],
        "redis_drain_us": cheapest["redis"]["cpu_us"],
        "api_us": min(r["submit"]["api_us"] for r in rounds),
        "worker_us": min(r["worker_us"] for r in rounds),
        "forward_us": min(r["forward_us"] for r in rounds),
        "worker_redis_us": min(r["worker_us"] + r["redis_us"] for r in rounds),
        "steady_per_s": fastest["span"]["steady_per_s"],
        # The fastest round's worker cores: a wall rate short of its device's with the worker far from a core is
        # the machine's other work; near one, the worker's own serial loop.
        "steady_worker_cores": fastest.get("worker_cores", 0.0),
    }


def feed(redis: RedisServer, tmp: Path, base_models: dict[str, Path], args: argparse.Namespace) -> dict[str, Any]:
    """Every scenario the chosen rows read, ``args.rounds`` times each; the host loop right before and after the
    instant CNN's drains."""
    rows = [row.strip() for row in args.only.split(",")] if args.only else list(ROWS)
    unknown = [row for row in rows if row not in ROWS]
    if unknown:
        raise SystemExit(f"--only: unknown row(s) {unknown}; rows: {', '.join(ROWS)}")
    wanted = list(dict.fromkeys(name for row in rows for name in ROWS[row]))
    models_dir = feed_models(tmp / "feed-models", base_models)
    out: dict[str, Any] = {
        "rows": rows,
        "rounds": args.rounds,
        "submit_s": args.submit_s,
        "clients": SUBMIT_CLIENTS,
        "loadgen": pick_tool(args.loadgen),
        "worker_env": worker_env(args),
        "forward": args.forward,
        "max_batch": MAX_BATCH,
        "sim_rates": SIM_RATES,
        "load_average": {"before": os.getloadavg()},
        "scenarios": {},
    }
    with Feed(redis, tmp, models_dir, args) as run:
        for name in wanted:
            scenario = SCENARIOS[name]
            host = "host_capacity" in rows and name == "jpeg"
            if host:
                jpeg = jpeg_of_about(JPEG_BYTES)
                out["host_loop"] = {"before": preprocess_loop(jpeg, args.loop_s)}
            rounds = [run.round(scenario, index) for index in range(args.rounds)]
            if host:
                out["host_loop"]["after"] = preprocess_loop(jpeg, args.loop_s)
                log.info("feed host loop: %.0f img/s before, %.0f after", *out["host_loop"].values())
            out["scenarios"][name] = {"rounds": rounds, "best": best(rounds)}
            if args.profile and name in PROFILED:
                profiled = run.round(scenario, args.rounds, profile=True)
                out.setdefault("profile", {})[name] = {
                    "jobs": profiled["jobs"],
                    "redis_submit": profiled["submit"]["redis"]["profile"],
                    "redis_drain": profiled["redis"]["profile"],
                    "worker": profiled["worker_profile"],
                    "worker_threads_us": profiled["worker"],
                }
        if "bulk_upload" in rows:
            uploads = [run.upload_round(index) for index in range(args.rounds)]
            out["bulk_upload"] = {
                "rounds": uploads,
                "best": {"api_us": min(u["api_us"] for u in uploads), "redis_us": min(u["redis_us"] for u in uploads)},
            }
    out["load_average"]["after"] = os.getloadavg()
    return out


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--only", help=f"comma-separated rows: {', '.join(ROWS)} (default: all)")
    parser.add_argument("--rounds", type=int, help="rounds of each scenario, a fresh worker each (default 3)")
    parser.add_argument("--submit-s", type=float, help="seconds of submits per round (default 3)")
    parser.add_argument("--loop-s", type=float, help="seconds of the host loop, before and after (default 3)")
    parser.add_argument(
        "--profile",
        action="store_true",
        help="after the measured rounds, one more of rows 1 and 2's scenarios: Redis's SLOWLOG per script and command,"
        " py-spy on the worker where installed (bench/feedprofile.py)",
    )
    parser.add_argument("--forward", default=FORWARD, help="where the forward runs: thread:NAME or process:COMM")
    parser.add_argument("--feeders", type=int, help=f"the workers' INFERQ_FEEDERS (default {FEEDERS}, a GPU's auto)")


def worker_env(args: argparse.Namespace) -> dict[str, str]:
    """The workers' environment: ``WORKER_ENV``, with ``--feeders`` where given."""
    feeders = getattr(args, "feeders", None)
    return WORKER_ENV if feeders is None else {**WORKER_ENV, "INFERQ_FEEDERS": str(feeders)}


def options(quick: bool, loadgen: str | None) -> argparse.Namespace:
    """Every row at its defaults: what ``make bench`` (bench/run.py) runs."""
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return settle(parser.parse_args([]), quick=quick, loadgen=loadgen)


def settle(args: argparse.Namespace, **given: Any) -> argparse.Namespace:
    """Defaults that ``--quick`` shortens."""
    vars(args).update(given)
    quick = getattr(args, "quick", False)
    args.loadgen = getattr(args, "loadgen", None)
    args.rounds = args.rounds or (1 if quick else 3)
    args.submit_s = args.submit_s or (1.5 if quick else 3.0)
    args.loop_s = args.loop_s or (1.5 if quick else 3.0)
    return args


def main() -> None:
    from bench.feedrows import markdown, rows

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="one round of each, shorter phases")
    parser.add_argument("--loadgen", choices=("hey", "wrk", "python"), help="the submits' generator")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    parser.add_argument("--aof", action="store_true", help="Redis with its append-only file on (everysec)")
    add_arguments(parser)
    args = settle(parser.parse_args())
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    tmp = Path(tempfile.mkdtemp(prefix="inferq-feed-"))
    started = time.perf_counter()
    # As the bench runs it: no AOF (``--aof``: appendonly, fsync every second, for the row beside it).
    redis = RedisServer(tmp / "redis", appendonly=args.aof)
    redis.start()
    try:
        results: dict[str, Any] = {"feed": feed(redis, tmp, build_models(tmp / "models"), args) | {"aof": args.aof}}
    finally:
        redis.stop()
    results["wall_s"] = time.perf_counter() - started
    args.out.mkdir(parents=True, exist_ok=True)
    results["targets"] = rows(results)
    name = "feed-aof" if args.aof else "feed"
    (args.out / f"{name}.json").write_text(json.dumps(results, indent=2))
    table = markdown(results)
    (args.out / f"{name}.md").write_text(table)
    print(table)
    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
