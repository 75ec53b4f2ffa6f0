"""`make bench`: inferq against the bare model and its peers, on this machine, in one run.

Writes bench/results/latest.{json,md,png} and prints the table. `--quick` shortens every
load point (for a smoke run); `--skip-peers` measures inferq and the bare model only.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import io
import json
import logging
import os
import platform
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
from bench.load import Stats, closed_loop, open_loop, submit_prefer_wait, submit_then_wait
from bench.models import ROOT, build_models
from bench.procs import Processes, wait_http
from bench.report import write_report
from shared.jobs import QueueCache, Submission, enqueue_job
from shared.keys import queue_name
from shared.models import load_model_config
from shared.redis_server import RedisServer, free_port
from shared.rqjson import JSONQueue
from shared.settings import Settings
from workers.batching import BatchWorker
from workers.handlers import load_handler
from workers.running import ModelRunner

log = logging.getLogger("bench")
RESNET_MAX_BATCH = 8
KEY_TTL_S = 10
CONCURRENCY = (1, 4, 16, 64)
PEERS = ("plain_rq", "sync_fastapi", "celery_batches")


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


def bare_model(model_dir: Path, batch_sizes: list[int], min_time_s: float) -> dict[str, Any]:
    """A tight model(batch) loop on prepared inputs: the physical limit."""
    config = load_model_config(model_dir)
    handler = load_handler(config, torch.device("cpu"))
    handler.load()
    payloads, content_type = payloads_for(model_dir.name, 8)
    item = handler.preprocess(payloads[0], content_type)
    points = []
    for size in batch_sizes:
        batch = torch.stack([item] * size)
        handler.predict(batch)  # warm-up
        runs, started = 0, time.perf_counter()
        while time.perf_counter() - started < min_time_s or runs < 3:
            handler.predict(batch)
            runs += 1
        per_batch_s = (time.perf_counter() - started) / runs
        points.append({"batch": size, "batch_ms": per_batch_s * 1000, "items_per_s": size / per_batch_s})
        log.info("bare %s batch %d: %.1f items/s", model_dir.name, size, size / per_batch_s)
    return {"points": points, "best_items_per_s": max(p["items_per_s"] for p in points)}


def drain(redis_url: str, model_dir: Path, inferq_jobs: int, rq_jobs: int) -> dict[str, Any]:
    """Jobs already enqueued, drained by one worker: inferq's BatchWorker vs RQ's SimpleWorker."""
    from bench.peers import plain_rq

    connection = Redis.from_url(redis_url)
    settings = Settings(redis_url=redis_url)
    config = load_model_config(model_dir)
    handler = load_handler(config, torch.device("cpu"))
    handler.load()
    payloads, content_type = payloads_for("noop", 8)

    connection.flushall()
    queues = QueueCache(connection)
    for i in range(inferq_jobs):
        enqueue_job(queues, settings, Submission("noop", payloads[i % 8], content_type))
    worker = BatchWorker(
        {"noop": ModelRunner(config, handler, torch.device("cpu"), config.max_batch)},
        connection=connection,
        settings=settings,
        name=f"bench-drain-{os.getpid()}",
    )
    started = time.perf_counter()
    worker.work(burst=True, logging_level="WARNING")
    inferq_s = time.perf_counter() - started

    connection.flushall()
    rq_per_s = plain_rq.drain_rate(connection, model_dir, [payloads[i % 8] for i in range(rq_jobs)], content_type)
    connection.flushall()
    connection.close()
    inferq_per_s = inferq_jobs / inferq_s
    return {
        "inferq_jobs_per_s": inferq_per_s,
        "rq_jobs_per_s": rq_per_s,
        "ratio": inferq_per_s / rq_per_s,
        "inferq_jobs": inferq_jobs,
        "rq_jobs": rq_jobs,
    }


class Bench:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.tmp = Path(tempfile.mkdtemp(prefix="inferq-bench-"))
        self.models = build_models(self.tmp / "models", resnet_max_batch=RESNET_MAX_BATCH)
        self.redis = RedisServer(self.tmp / "redis", appendonly=False)
        self.point_s = 2.0 if args.quick else args.point_seconds
        self.results: dict[str, Any] = {
            "machine": {
                "platform": platform.platform(),
                "cpus": os.cpu_count(),
                "torch": torch.__version__,
                "device": "cpu",
                "torch_threads": torch.get_num_threads(),
            },
            "started": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
            "point_seconds": self.point_s,
        }

    def run(self) -> dict[str, Any]:
        self.redis.start()
        try:
            bare_time = 0.3 if self.args.quick else 1.5
            self.results["bare"] = {
                "resnet": bare_model(self.models["resnet"], [1, 2, 4, RESNET_MAX_BATCH], bare_time),
                "digits": bare_model(self.models["digits"], [1, 8, 64], bare_time),
                "noop": bare_model(self.models["noop"], [1, 256], bare_time),
            }
            jobs = (300, 100) if self.args.quick else (5000, 500)
            self.results["drain"] = drain(self.redis.url, self.models["noop"], *jobs)
            bulk_items = 2000 if self.args.quick else 20000
            self.results["bulk_drain"] = bulk_vs_singles(self.redis.url, self.models["noop"], bulk_items)
            self.results["systems"] = {}
            self._inferq()
            if not self.args.skip_peers:
                for peer in self.args.peers.split(","):
                    self._peer(peer)
        finally:
            self.redis.stop()
        return self.results

    def _sweep(self, name: str, model: str, call: Any, concurrency: tuple[int, ...]) -> list[dict[str, Any]]:
        payloads, _ = payloads_for(model)
        out = []
        for clients in concurrency:
            stats: Stats = asyncio.run(closed_loop(call, payloads, clients, self.point_s, f"{name} c={clients}"))
            out.append(stats.summary())
            log.info(
                "%s %s c=%d: %.1f/s p50 %.1f ms",
                name,
                model,
                clients,
                out[-1]["throughput_per_s"],
                out[-1]["p50_ms"] or -1,
            )
        return out

    def _inferq(self) -> None:
        Redis.from_url(self.redis.url).flushall()
        port = free_port()
        env = {
            "INFERQ_REDIS_URL": self.redis.url,
            "INFERQ_MODELS_DIR": str(self.tmp / "models"),
            # Short TTLs so the run can check that Redis shrinks back once results expire.
            "INFERQ_RESULT_TTL_S": str(KEY_TTL_S),
            "INFERQ_FAILURE_TTL_S": str(KEY_TTL_S),
            # A failure must outlive a job's timeout (settings refuse less): the bench's jobs take milliseconds.
            "INFERQ_JOB_TIMEOUT_S": str(KEY_TTL_S),
        }
        procs = Processes(self.tmp, env)
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
            for model in ("resnet", "digits", "noop"):
                _, content_type = payloads_for(model, 1)
                call = submit_then_wait(base, f"/v1/models/{model}/jobs", content_type, "/v1/jobs/{id}")
                concurrency = CONCURRENCY if model == "resnet" else (1, 16, 64)
                result[model] = {"closed": self._sweep("inferq", model, call, concurrency)}
            one_call = submit_prefer_wait(base, "/v1/models/noop/jobs", "application/json")
            self.results["systems"]["inferq (Prefer: wait)"] = {
                "noop": {"closed": self._sweep("inferq (Prefer: wait)", "noop", one_call, (1, 16, 64))}
            }
            best = self.results["bare"]["resnet"]["best_items_per_s"]
            call = submit_then_wait(base, "/v1/models/resnet/jobs", "image/jpeg", "/v1/jobs/{id}")
            payloads, _ = payloads_for("resnet")
            result["resnet"]["open"] = []
            for fraction in (0.25, 0.5, 0.75, 0.95):
                stats = asyncio.run(open_loop(call, payloads, best * fraction, self.point_s, f"rate {fraction:.2f}"))
                result["resnet"]["open"].append({**stats.summary(), "fraction_of_bare": fraction})
            self.results["systems"]["inferq"] = result
            images, _ = payloads_for("resnet")
            lanes = lanes_latency(base, "resnet", images, "image/jpeg", 80 if self.args.quick else 400)
            lanes["batch_ms"] = self.results["bare"]["resnet"]["points"][-1]["batch_ms"]
            self.results["lanes"] = lanes
            time.sleep(KEY_TTL_S + 2)
            for model in self.models:
                # What a worker's maintenance (or `rq info`) does to RQ's registries.
                clean_registries(JSONQueue(queue_name(model), connection=connection))
            keys_after = {k.decode() for k in connection.scan_iter(count=1000)}
            self.results["keys"] = {
                "before": len(keys_before),
                "after": len(keys_after),
                "added": sorted(keys_after - keys_before),
                "ttl_s": KEY_TTL_S,
            }
            connection.close()
        finally:
            procs.stop()

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
                call = submit_then_wait(base, "/jobs", content_type, "/jobs/{id}")
                concurrency = CONCURRENCY if model == "resnet" else (1, 16)
                result[model] = {"closed": self._sweep(peer, model, call, concurrency)}
                procs.stop()
                Redis.from_url(self.redis.url).flushall()
            self.results["systems"][peer] = result
        except (RuntimeError, OSError) as exc:
            log.warning("peer %s unavailable: %s", peer, exc)
            self.results["systems"][peer] = {"unavailable": str(exc)}
        finally:
            procs.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--skip-peers", action="store_true")
    parser.add_argument("--point-seconds", type=float, default=6.0)
    parser.add_argument("--peers", default=",".join(PEERS), help="comma-separated subset of " + ",".join(PEERS))
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
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
