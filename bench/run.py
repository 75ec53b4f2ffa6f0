"""`make bench`: inferq against the bare model and its peers, on this machine, in one run.

Writes bench/results/latest.{json,md,png} and prints the table. `--quick` shortens every
load point (for a smoke run); `--skip-peers` measures inferq and the bare model only; `--skip-feed` leaves out
bench.feed's rows (CPU per job, simulated devices; `python -m bench.feed` runs them alone).
"""

from __future__ import annotations

import argparse
import importlib.util
import io
import json
import logging
import os
import platform
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import torch
from PIL import Image
from redis import Redis
from rq.registry import clean_registries

from bench.bulk import bulk_vs_singles, lanes_latency
from bench.durability import replica_vs_async
from bench.fairness import fairness
from bench.feed import feed
from bench.feed import options as feed_options
from bench.generators import LoadResult, hammer, limited, pick_tool, python_loop
from bench.models import ROOT, build_models
from bench.procs import Processes, wait_http
from bench.report import write_report
from bench.shards import two_redis_vs_one
from bench.tracing import tracing_cost
from bench.vs_litserve import TEXT_MAX_BATCH, image_inputs, text_inputs, texts, vs_litserve
from inferq.shared import keys
from inferq.shared.jobs import QueueCache, Submission, enqueue_job
from inferq.shared.keys import queue_name
from inferq.shared.models import load_model_config
from inferq.shared.redis_server import RedisServer, free_port
from inferq.shared.rqjson import JSONQueue
from inferq.shared.settings import Settings
from inferq.workers.batching import BatchWorker
from inferq.workers.handlers import load_handler
from inferq.workers.running import form_name, laid_out, load_runner

log = logging.getLogger("bench")
RESNET_MAX_BATCH = 8
KEY_TTL_S = 10
CONCURRENCY = (1, 4, 16, 64)
# Many clients each waiting on its job (`Prefer: wait`), and the concurrency of the submit-path rows.
WAITING_CLIENTS = (16, 64, 256, 1024)
SUBMIT_CLIENTS = 64
# Alternating rounds of the API-alone rows (one process, `--workers 2`); the best of each figure counts.
API_ROUNDS = 4
WARM_UP_S = 2.0
# Passes of the waiting-clients sweep; each level keeps its better pass.
WAITING_ROUNDS = 2
PEERS = ("plain_rq", "sync_fastapi", "celery_batches")


def opening_burst_s(clients: int, point_s: float) -> float:
    """How long to run ``clients`` waiting clients. hey and wrk open every connection at once, and that opening
    burst (one request per client, all queued behind each other in the listen queue) must not be most of what a
    point measures: at 1,024 clients it is a third of an 8 s run's requests. 32 new clients per second of run
    keeps it a small share at every concurrency."""
    return max(point_s, clients / 32)


def payloads_for(model: str, count: int = 32) -> tuple[list[bytes], str]:
    """Inputs every system gets, and their content type."""
    if model == "noop":
        return [json.dumps({"inputs": [i, 1.0, 2.0, 3.0]}).encode() for i in range(count)], "application/json"
    if model == "digits":
        spec = importlib.util.spec_from_file_location("digits_train", ROOT / "models" / "digits" / "train.py")
        assert spec and spec.loader
        train = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(train)
        _, _, images, _ = train.load_split()
        return [train.render_png(image) for image in images[:count]], "image/png"
    rng = np.random.default_rng(0)
    out = []
    for _ in range(count):
        base = np.linspace(0, 255, 224, dtype=np.float32)
        pixels = (base[None, :, None] + rng.normal(0, 40, (224, 224, 3))).clip(0, 255).astype(np.uint8)
        buffer = io.BytesIO()
        Image.fromarray(pixels).save(buffer, format="JPEG", quality=90)
        out.append(buffer.getvalue())
    return out, "image/jpeg"


def bare_model(
    model_dir: Path, batch_sizes: list[int], min_time_s: float, device: str = "cpu", as_worker: bool = False
) -> dict[str, Any]:
    """A tight model(batch) loop on prepared inputs: the physical limit of the model as given (``as_worker``: of the
    model in the form inferq's worker chooses at load, its layout and fused graph, workers/running.py)."""
    config = load_model_config(model_dir)
    form = "as given"
    if as_worker:
        runner = load_runner(config, torch.device(device), max(batch_sizes))
        handler = runner.handler
        form = form_name(runner.channels_last, runner.fused)
    else:
        handler = load_handler(config, torch.device(device))
        handler.load()
    payloads, content_type = payloads_for(model_dir.name, 8)
    item = handler.preprocess(payloads[0], content_type)
    points = []
    for size in batch_sizes:
        with torch.inference_mode():
            batch = handler.collate([item] * size)
            if as_worker:
                batch = laid_out(runner, batch)
            handler.predict(batch)  # warm-up
            _sync(device)
            runs, started = 0, time.perf_counter()
            while time.perf_counter() - started < min_time_s or runs < 3:
                handler.uncollate(handler.predict(batch), size)  # outputs back on the host, as a worker needs
                runs += 1
        per_batch_s = (time.perf_counter() - started) / runs
        points.append({"batch": size, "batch_ms": per_batch_s * 1000, "items_per_s": size / per_batch_s})
        log.info("bare %s (%s) on %s, batch %d: %.1f items/s", model_dir.name, form, device, size, size / per_batch_s)
    return {"points": points, "best_items_per_s": max(p["items_per_s"] for p in points), "form": form}


def bare_neighbours(model_dir: Path, before: dict[str, Any] | None, min_time_s: float) -> dict[str, Any]:
    """The bare model at the max batch as given and as inferq's worker runs it, right before or after a comparison;
    with ``before``, each figure is the faster of the two neighbours (a shared host's speed drifts over minutes)."""
    given = bare_model(model_dir, [RESNET_MAX_BATCH], min_time_s)
    worker = bare_model(model_dir, [RESNET_MAX_BATCH], min_time_s, as_worker=True)
    out = {"bare_per_s": given["best_items_per_s"], "bare_worker_per_s": worker["best_items_per_s"]}
    out["bare_worker_form"] = worker["form"]
    if before:
        out["bare_per_s"] = max(out["bare_per_s"], before["bare_per_s"])
        out["bare_worker_per_s"] = max(out["bare_worker_per_s"], before["bare_worker_per_s"])
    return out


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _worker(connection: Redis, settings: Settings, model_dir: Path, device: str, name: str) -> BatchWorker:
    config = load_model_config(model_dir)
    # As `inferq worker` loads it: its batch-axis check, and its layout and graph timed at load.
    runner = load_runner(config, torch.device(device), config.max_batch)
    return BatchWorker({config.name: runner}, connection=connection, settings=settings, name=name)


def drain(
    redis_url: str,
    model_dir: Path,
    inferq_jobs: int,
    rq_jobs: int,
    rounds: int = 3,
    digits_dir: Path | None = None,
) -> dict[str, Any]:
    """Jobs already enqueued, drained by one worker: inferq's BatchWorker vs RQ's SimpleWorker, both on the no-op
    model; with ``digits_dir``, also inferq on real digit jobs (8x8 PNGs through the digits CNN) against the same
    RQ no-op drain (issue 31: what a real model's image work costs beside the queue's).

    The sides alternate, ``rounds`` times each, and the best round of each counts: on a shared machine a
    burst of someone else's work then lands on one round, not on one side of the ratio.
    """
    from bench.peers import plain_rq

    connection = Redis.from_url(redis_url)
    settings = Settings(redis_url=redis_url)
    payloads, content_type = payloads_for("noop", 8)
    inferq_rates, rq_rates, digit_rates = [], [], []

    def inferq_drain(model: str, folder: Path, inputs: list[bytes], kind: str, round_: int) -> float:
        connection.flushall()
        queues = QueueCache(connection)
        for i in range(inferq_jobs):
            enqueue_job(queues, settings, Submission(model, inputs[i % len(inputs)], kind))
        worker = _worker(connection, settings, folder, "cpu", f"bench-drain-{model}-{os.getpid()}-{round_}")
        started = time.perf_counter()
        worker.work(burst=True, logging_level="WARNING")
        return inferq_jobs / (time.perf_counter() - started)

    for round_ in range(rounds):
        inferq_rates.append(inferq_drain("noop", model_dir, payloads, content_type, round_))
        connection.flushall()
        jobs = [payloads[i % 8] for i in range(rq_jobs)]
        rq_rates.append(plain_rq.drain_rate(connection, model_dir, jobs, content_type))
        if digits_dir is not None:
            pngs, png_type = payloads_for("digits", 8)
            digit_rates.append(inferq_drain("digits", digits_dir, pngs, png_type, round_))
        log.info(
            "drain round %d: inferq %.0f, RQ SimpleWorker %.0f, inferq digits %s jobs/s",
            round_,
            inferq_rates[-1],
            rq_rates[-1],
            f"{digit_rates[-1]:.0f}" if digit_rates else "-",
        )
    connection.flushall()
    connection.close()
    by_round: dict[str, list[float]] = {"inferq": inferq_rates, "rq": rq_rates}
    out: dict[str, Any] = {
        "inferq_jobs_per_s": max(inferq_rates),
        "rq_jobs_per_s": max(rq_rates),
        "ratio": max(inferq_rates) / max(rq_rates),
        "inferq_jobs": inferq_jobs,
        "rq_jobs": rq_jobs,
        "rounds": by_round,
    }
    if digit_rates:
        out["digits_jobs_per_s"] = max(digit_rates)
        out["digits_ratio"] = max(digit_rates) / max(rq_rates)
        by_round["digits"] = digit_rates
    return out


class Saturation:
    """One worker, its model loaded and warm, draining queues of ResNet jobs filled beforehand.

    ``rate()`` can be called again and again: rounds of two such workers alternate cheaply, so a
    burst of someone else's work on a shared machine lands on one round, not on one side.
    """

    def __init__(self, redis_url: str, model_dir: Path, device: str, overlap: str) -> None:
        self.connection = Redis.from_url(redis_url)
        self.settings = Settings(redis_url=redis_url, overlap=overlap)  # type: ignore[arg-type]
        self.model = model_dir.name
        self.label = f"{device}, overlap {overlap}"
        self.payloads, self.content_type = payloads_for(self.model, 8)
        name = f"bench-saturation-{device}-{overlap}-{os.getpid()}"
        self.worker = _worker(self.connection, self.settings, model_dir, device, name)
        warm = [(self.payloads[0], self.content_type)] * RESNET_MAX_BATCH
        self.worker.runners[self.model].handler.run(warm)

    def rate(self, jobs: int) -> float:
        """Items per second drained from a queue of ``jobs``."""
        self.connection.flushall()
        queues = QueueCache(self.connection)
        for i in range(jobs):
            enqueue_job(queues, self.settings, Submission(self.model, self.payloads[i % 8], self.content_type))
        started = time.perf_counter()
        self.worker.work(burst=True, logging_level="WARNING")
        per_s = jobs / (time.perf_counter() - started)
        self.connection.flushall()
        log.info("saturation %s on %s: %.1f items/s", self.model, self.label, per_s)
        return per_s


def saturation(redis_url: str, model_dir: Path, jobs: int, device: str, overlap: str) -> float:
    """Images per second one worker drains from a full queue of ResNet jobs: the saturation figure."""
    return Saturation(redis_url, model_dir, device, overlap).rate(jobs)


def overlap_cost(redis_url: str, model_dir: Path, jobs: int, rounds: int) -> dict[str, Any]:
    """ResNet saturation on the CPU with the overlap off, as shipped (auto) and forced on, alternated; the best
    of each. The target compares what a CPU user runs (auto) with off; forced on is shown beside it."""
    modes = ("off", "auto", "on")
    workers = {mode: Saturation(redis_url, model_dir, "cpu", mode) for mode in modes}
    rates: dict[str, list[float]] = {mode: [] for mode in modes}
    for _ in range(rounds):
        for mode, worker in workers.items():
            rates[mode].append(worker.rate(jobs))
    best = {mode: max(values) for mode, values in rates.items()}
    return {
        "jobs": jobs,
        "rounds": rounds,
        **rates,
        "ratio": best["auto"] / best["off"],
        "forced_on_ratio": best["on"] / best["off"],
    }


def gpu_rows(redis_url: str, model_dir: Path, quick: bool) -> dict[str, Any]:
    """On a CUDA device: bare ResNet against a worker's saturation there, overlap on (its default)."""
    if not torch.cuda.is_available():
        return {"owed": "no GPU: torch.cuda.is_available() is false on this machine"}
    bare = bare_model(model_dir, [1, RESNET_MAX_BATCH], 0.3 if quick else 1.5, "cuda")
    jobs = 400 if quick else 2000
    return {
        "device": torch.cuda.get_device_name(0),
        "bare": bare,
        "saturation_overlap_on": saturation(redis_url, model_dir, jobs, "cuda", "auto"),
        "saturation_overlap_off": saturation(redis_url, model_dir, jobs, "cuda", "off"),
    }


def api_has_workers_flag() -> bool:
    """Whether this checkout's ``inferq api`` takes ``--workers`` (issue 11's multi-process API)."""
    from inferq.cli import build_parser

    _, unknown = build_parser().parse_known_args(["api", "--workers", "2"])
    return not unknown


class Bench:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.tmp = Path(tempfile.mkdtemp(prefix="inferq-bench-"))
        self.models = build_models(self.tmp / "models", resnet_max_batch=RESNET_MAX_BATCH)
        self.redis = RedisServer(self.tmp / "redis", appendonly=False)
        self.point_s = 2.0 if args.quick else args.point_seconds
        self.tool = pick_tool(args.loadgen)
        # The API-alone rows put two API processes on the machine beside the generator: wrk, where installed,
        # takes 41 us of CPU per request where hey takes 92 (measured against /healthz at 64 connections), so
        # more of a 2-core machine goes to what is measured. Both sides of each ratio use the same one.
        self.api_tool = args.loadgen or ("wrk" if shutil.which("wrk") else self.tool)
        self.results: dict[str, Any] = {
            "machine": {
                "platform": platform.platform(),
                "cpus": os.cpu_count(),
                "torch": torch.__version__,
                "device": "cpu",
                "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
                "torch_threads": torch.get_num_threads(),
            },
            "started": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
            "point_seconds": self.point_s,
            "loadgen": self.tool,
        }
        self.bare_s = 0.3 if args.quick else 1.5  # each bare loop's length
        # The generator's ceiling on /healthz, by (label, clients): measured next to every figure.
        self.ceilings: dict[str, dict[str, Any]] = {}

    def run(self) -> dict[str, Any]:
        self.redis.start()
        try:
            quick = self.args.quick
            bare_time = self.bare_s
            self.results["bare"] = {
                "resnet": bare_model(self.models["resnet"], [1, 2, 4, RESNET_MAX_BATCH], bare_time),
                "digits": bare_model(self.models["digits"], [1, 8, 64], bare_time),
                "noop": bare_model(self.models["noop"], [1, 256], bare_time),
            }
            jobs = (2000, 150) if quick else (10000, 500)
            self.results["drain"] = drain(
                self.redis.url, self.models["noop"], *jobs, rounds=1 if quick else 5, digits_dir=self.models["digits"]
            )
            overlap_jobs, overlap_rounds = (32, 1) if quick else (48, 4)
            self.results["overlap"] = overlap_cost(self.redis.url, self.models["resnet"], overlap_jobs, overlap_rounds)
            self.results["gpu"] = gpu_rows(self.redis.url, self.models["resnet"], quick)
            bulk_items = 2000 if quick else 20000
            self.results["bulk_drain"] = bulk_vs_singles(self.redis.url, self.models["noop"], bulk_items)
            if not self.args.skip_feed:  # issue 46's rows: CPU per job, simulated devices (bench/feed.py)
                self.results["feed"] = feed(self.redis, self.tmp, self.models, feed_options(quick, self.args.loadgen))
            self.results["systems"] = {}
            self._api_alone()
            self.results["durability"] = replica_vs_async(self, 1 if quick else API_ROUNDS, WARM_UP_S)
            self.results["shards"] = two_redis_vs_one(
                self.tmp, self.models["noop"], 2000 if quick else 10000, 1 if quick else 3
            )
            self.results["fairness"] = fairness(self.redis.url, self.tmp / "models", quick)
            if shutil.which("hey"):  # the submit row reads hey's count of accepted submits
                self.results["tracing"] = tracing_cost(
                    self.redis.url, self.tmp, 1 if quick else 3, 2000 if quick else 8000
                )
            self._litserve()
            self._inferq()
            if not self.args.skip_peers:
                for peer in self.args.peers.split(","):
                    self._peer(peer)
            self.results["ceilings"] = self.ceilings
        finally:
            self.redis.stop()
        return self.results

    def _litserve(self) -> None:
        """inferq against LitServe on the ResNet-sized CNN and the langid text model, one request per input
        (bench.vs_litserve)."""
        if self.args.skip_peers:
            return
        if not shutil.which("hey") or importlib.util.find_spec("litserve") is None:
            self.results["litserve"] = {
                "unavailable": "needs hey and litserve (the bench extra: make bench installs it)"
            }
            return
        image = payloads_for("resnet", 1)[0][0]
        # A third round for the CNN: its sides run the model near its limit, within a few percent of each other,
        # and this host's speed moves by a third within minutes; the best of three meets each side at its best.
        cnn_rounds, text_rounds = (1, 1) if self.args.quick else (3, 2)
        models = self.tmp / "models"
        before = bare_neighbours(self.models["resnet"], None, self.bare_s)
        vs = vs_litserve(
            self.redis.url,
            models,
            "resnet",
            image_inputs(image),
            RESNET_MAX_BATCH,
            cnn_rounds,
            self.point_s,
            self.tmp,
            policies=True,  # inferq's batch waits side by side: adaptive, greedy, fixed (workers/fill.py)
        )
        vs.update(bare_neighbours(self.models["resnet"], before, self.bare_s))
        self.results["litserve"] = vs
        if not shutil.which("wrk"):
            self.results["litserve_text"] = {"unavailable": "needs wrk (a mix of texts; hey sends one body)"}
            return
        corpus = text_inputs(texts())
        self.results["litserve_text"] = vs_litserve(
            self.redis.url, models, "langid", corpus, TEXT_MAX_BATCH, text_rounds, self.point_s, self.tmp
        )

    def _env(self) -> dict[str, str]:
        return {
            "INFERQ_REDIS_URL": self.redis.url,
            "INFERQ_MODELS_DIR": str(self.tmp / "models"),
            # Short TTLs so the run can check that Redis shrinks back once results expire.
            "INFERQ_RESULT_TTL_S": str(KEY_TTL_S),
            "INFERQ_FAILURE_TTL_S": str(KEY_TTL_S),
            # A failure must outlive a job's timeout (settings refuse less): the bench's jobs take milliseconds.
            "INFERQ_JOB_TIMEOUT_S": str(KEY_TTL_S),
        }

    # -- the load generator and its ceiling ------------------------------------------------------
    def _hammer(
        self, url: str, clients: int, duration_s: float | None = None, tool: str | None = None, **request: Any
    ) -> dict[str, Any]:
        tool = tool or self.tool
        result: LoadResult = hammer(url, clients, duration_s or self.point_s, tool=tool, **request)
        out = result.summary()
        log.info(
            "%s %s c=%d: %.0f/s ok, %d failed, p50 %s ms, p99 %s ms",
            tool,
            url,
            clients,
            result.per_s,
            result.failed,
            _ms(result.p50_ms),
            _ms(result.p99_ms),
        )
        return out

    def _ceiling(self, base: str, clients: int, label: str, tool: str | None = None) -> dict[str, Any]:
        """The generator's own rate on the bare route of the server it measures, at this concurrency."""
        ceiling = self._hammer(f"{base}/healthz", clients, tool=tool)
        self.ceilings[f"{label} c={clients}"] = ceiling
        return ceiling

    def _sweep(
        self, name: str, model: str, call: str, args: list[str], concurrency: tuple[int, ...], base: str
    ) -> list[dict[str, Any]]:
        """Closed loops by the asyncio generator in its own process; each point against its ceiling there."""
        payloads, _ = payloads_for(model)
        out = []
        for clients in concurrency:
            key = f"python c={clients}"
            if key not in self.ceilings:
                self.ceilings[key] = python_loop(
                    "closed", "bare_get", [base, "/healthz"], [b""], self.point_s, key, clients=clients
                )
            point = python_loop("closed", call, args, payloads, self.point_s, f"{name} c={clients}", clients=clients)
            ceiling = self.ceilings[key]["throughput_per_s"]
            point["generator_ceiling_per_s"] = ceiling
            point["limited_by_generator"] = limited(point["throughput_per_s"], ceiling, point["calls_per_item"])
            out.append(point)
            log.info(
                "%s %s c=%d: %.1f/s p50 %s ms (generator ceiling %.0f calls/s)",
                name,
                model,
                clients,
                point["throughput_per_s"],
                _ms(point["p50_ms"]),
                ceiling,
            )
        return out

    # -- the API alone (worker paused): the submit path ------------------------------------------
    def _submits(self, base: str, duration_s: float | None = None) -> dict[str, Any]:
        """Digit PNG submits from SUBMIT_CLIENTS connections of the API-alone generator."""
        png = payloads_for("digits", 1)[0][0]
        url = f"{base}/v1/models/digits/jobs"
        headers = {"content-type": "image/png"}
        return self._hammer(url, SUBMIT_CLIENTS, duration_s, self.api_tool, method="POST", body=png, headers=headers)

    def _submit_rates(self, base: str, label: str) -> dict[str, Any]:
        ceiling = self._ceiling(base, SUBMIT_CLIENTS, label, tool=self.api_tool)
        submits = self._submits(base)
        return {
            "healthz": ceiling,
            "submits": submits,
            "ratio": submits["per_s"] / max(ceiling["per_s"], 1e-9),
            "limited_by_generator": limited(submits["per_s"], ceiling["per_s"]),
        }

    def _api_alone(self) -> None:
        """Digit submits against /healthz with no worker running: one API process and `--workers 2`, both up at
        once and measured in alternating rounds, the best of each figure counting (as the drain), so a burst of
        someone else's work on a shared machine lands on one round, not on one side of a ratio."""
        result: dict[str, Any] = {"clients": SUBMIT_CLIENTS, "tool": self.api_tool}
        # Room for every submit of a load point: no 429 for a full queue while no worker drains it.
        env = {**self._env(), "INFERQ_MAX_QUEUE_LENGTH": "100000000", "INFERQ_QUEUE_TTL_S": "600"}
        counts = (1, 2) if api_has_workers_flag() else (1,)
        if len(counts) == 1:
            result["two"] = {"not_measured": "`inferq api --workers` does not exist in this checkout"}
        procs = Processes(self.tmp, env)
        bases: dict[int, str] = {}
        rounds: dict[int, list[dict[str, Any]]] = {n: [] for n in counts}
        try:
            for processes in counts:
                port = free_port()
                extra = ["--workers", str(processes)] if processes > 1 else []
                procs.start(
                    f"inferq-api-{processes}", "inferq", "--log-level", "WARNING", "api", "--port", str(port), *extra
                )
                bases[processes] = f"http://127.0.0.1:{port}"
            for base in bases.values():
                wait_http(f"{base}/readyz")
                # Not counted: a fresh process's first thousands of requests fill its caches (and with
                # --workers 2 each process sees half of them), so a cold first round measured the start-up.
                self._submits(base, WARM_UP_S)
            for _ in range(1 if self.args.quick else API_ROUNDS):
                for processes, base in bases.items():
                    Redis.from_url(self.redis.url).flushall()
                    rounds[processes].append(self._submit_rates(base, f"api x{processes}"))
        finally:
            procs.stop()
        for processes, measured in rounds.items():
            healthz = max((r["healthz"] for r in measured), key=lambda p: p["per_s"])
            submits = max((r["submits"] for r in measured), key=lambda p: p["per_s"])
            result["one" if processes == 1 else "two"] = {
                "healthz": healthz,
                "submits": submits,
                "ratio": submits["per_s"] / max(healthz["per_s"], 1e-9),
                "limited_by_generator": limited(submits["per_s"], healthz["per_s"]),
                "rounds": [{"healthz": r["healthz"]["per_s"], "submits": r["submits"]["per_s"]} for r in measured],
            }
        Redis.from_url(self.redis.url).flushall()
        self.results["api"] = result

    # -- inferq with its workers -----------------------------------------------------------------
    def _inferq(self) -> None:
        Redis.from_url(self.redis.url).flushall()
        port = free_port()
        procs = Processes(self.tmp, self._env())
        try:
            procs.start("inferq-api", "inferq", "--log-level", "WARNING", "api", "--port", str(port))
            for model in self.models:
                procs.start(f"inferq-worker-{model}", "inferq", "--log-level", "WARNING", "worker", "--model", model)
            base = f"http://127.0.0.1:{port}"
            wait_http(f"{base}/readyz")
            time.sleep(4)  # workers load their models
            connection = Redis.from_url(self.redis.url)
            for model in self.models:  # one job each, so RQ's per-queue structures exist before the count
                payloads, content_type = payloads_for(model, 1)
                httpx.post(
                    f"{base}/v1/models/{model}/jobs",
                    content=payloads[0],
                    headers={"content-type": content_type, "prefer": "wait=30"},
                    timeout=40,
                )
            keys_before = {k.decode() for k in connection.scan_iter(count=1000)}
            result: dict[str, Any] = {}
            # The bare model right before and right after inferq's ResNet loads too: a shared machine's speed drifts
            # over a run (on 2026-11-28 inferq's one-client p50 read 32.7 ms in this sweep and 23 ms seven minutes
            # later, against LitServe), so the saturation and one-client rows compare against the faster of these
            # two neighbours, not against a bare loop measured a quarter of an hour before.
            near = [bare_model(self.models["resnet"], [1, RESNET_MAX_BATCH], self.bare_s)]
            for model in ("resnet", "digits", "noop"):
                _, content_type = payloads_for(model, 1)
                args = [base, f"/v1/models/{model}/jobs", content_type, "/v1/jobs/{id}"]
                concurrency = CONCURRENCY if model == "resnet" else (1, 16, 64)
                result[model] = {"closed": self._sweep("inferq", model, "submit_then_wait", args, concurrency, base)}
                if model == "resnet":
                    near.append(bare_model(self.models["resnet"], [1, RESNET_MAX_BATCH], self.bare_s))
            self.results["bare_near_resnet"] = near
            self._waiting_clients(base)
            best = self.results["bare"]["resnet"]["best_items_per_s"]
            payloads, _ = payloads_for("resnet")
            args = [base, "/v1/models/resnet/jobs", "image/jpeg", "/v1/jobs/{id}"]
            result["resnet"]["open"] = []
            for fraction in (0.25, 0.5, 0.75, 0.95):
                label, rate = f"rate {fraction:.2f}", best * fraction
                point = python_loop("open", "submit_then_wait", args, payloads, self.point_s, label, rate=rate)
                result["resnet"]["open"].append({**point, "fraction_of_bare": fraction})
            self.results["systems"]["inferq"] = result
            images, _ = payloads_for("resnet")
            lanes = lanes_latency(base, "resnet", images, "image/jpeg", 40 if self.args.quick else 400)
            lanes["batch_ms"] = self.results["bare"]["resnet"]["points"][-1]["batch_ms"]
            self.results["lanes"] = lanes
            time.sleep(KEY_TTL_S + 2)
            for model in self.models:
                for lane in keys.LANES:  # what a worker's maintenance (or `rq info`) does to RQ's registries
                    clean_registries(JSONQueue(queue_name(model, lane), connection=connection))
            keys_after = {k.decode() for k in connection.scan_iter(count=1000)}
            added = sorted(keys_after - keys_before)
            self.results["keys"] = {
                "before": len(keys_before),
                "after": len(keys_after),
                "added": added,
                # -1: no TTL (-2: gone since the scan). Windows of the status page's charts and a batch's
                # records outlive a job's result TTL by design; each still expires.
                "added_without_ttl": [key for key in added if connection.ttl(key) == -1],
                "jobs_left": sorted(key for key in added if key.startswith("rq:job:")),
                "ttl_s": KEY_TTL_S,
            }
            connection.close()
        finally:
            procs.stop()

    def _waiting_clients(self, base: str) -> None:
        """Many clients each holding a `Prefer: wait` submit of the no-op model open: 16 to 1,024.

        The sweep runs twice and each level keeps its better pass (as the other rows alternate rounds): one
        API process is CPU-bound here, so a burst of someone else's work moves a single pass's level by 10%.
        """
        body = payloads_for("noop", 1)[0][0]
        best: dict[int, dict[str, Any]] = {}
        for _ in range(1 if self.args.quick else WAITING_ROUNDS):
            for clients in WAITING_CLIENTS:
                point = self._hammer(
                    f"{base}/v1/models/noop/jobs",
                    clients,
                    opening_burst_s(clients, self.point_s),
                    method="POST",
                    body=body,
                    headers={"content-type": "application/json", "prefer": "wait=60"},
                )
                if clients not in best or point["per_s"] > best[clients]["per_s"]:
                    best[clients] = point
        points = []
        for clients in WAITING_CLIENTS:
            ceiling = self._ceiling(base, clients, "waiting")
            point = best[clients]
            point["generator_ceiling_per_s"] = ceiling["per_s"]
            point["limited_by_generator"] = limited(point["per_s"], ceiling["per_s"])
            points.append(point)
        self.results["waiting"] = {"tool": self.tool, "points": points}

    def _peer(self, peer: str) -> None:
        Redis.from_url(self.redis.url).flushall()
        port = free_port()
        procs = Processes(self.tmp, {})
        result: dict[str, Any] = {}
        try:
            for model in ("resnet", "noop", "digits"):
                module = f"bench.peers.{peer}"
                common = ["--model-dir", str(self.models[model])]
                if peer == "sync_fastapi":
                    procs.start(
                        f"{peer}-{model}",
                        module,
                        "api",
                        "--port",
                        str(port),
                        "--workers",
                        "2",
                        "--threads",
                        "1",
                        *common,
                    )
                else:
                    procs.start(
                        f"{peer}-api-{model}", module, "api", "--port", str(port), "--redis-url", self.redis.url
                    )
                    procs.start(f"{peer}-worker-{model}", module, "worker", "--redis-url", self.redis.url, *common)
                base = f"http://127.0.0.1:{port}"
                wait_http(f"{base}/healthz")
                time.sleep(3)
                _, content_type = payloads_for(model, 1)
                args = [base, "/jobs", content_type, "/jobs/{id}"]
                concurrency = CONCURRENCY if model == "resnet" else (1, 16)
                result[model] = {"closed": self._sweep(peer, model, "submit_then_wait", args, concurrency, base)}
                procs.stop()
                Redis.from_url(self.redis.url).flushall()
            self.results["systems"][peer] = result
        except (RuntimeError, OSError) as exc:
            log.warning("peer %s unavailable: %s", peer, exc)
            self.results["systems"][peer] = {"unavailable": str(exc)}
        finally:
            procs.stop()


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--skip-peers", action="store_true")
    parser.add_argument("--skip-feed", action="store_true", help="leave out bench.feed's rows (CPU per job)")
    parser.add_argument("--point-seconds", type=float, default=6.0)
    parser.add_argument("--peers", default=",".join(PEERS), help="comma-separated subset of " + ",".join(PEERS))
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    parser.add_argument(
        "--loadgen",
        choices=("hey", "wrk", "python"),
        help="the load generator (default: hey, else wrk, else the asyncio one in its own process;"
        " INFERQ_BENCH_LOADGEN also names one)",
    )
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    torch.set_num_threads(os.cpu_count() or 1)
    started = time.perf_counter()
    results = Bench(args).run()
    results["wall_s"] = time.perf_counter() - started
    table = write_report(results, args.out)
    print(table)


if __name__ == "__main__":
    main()
