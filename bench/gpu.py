"""`python -m bench.gpu`: inferq's GPU path on a real GPU, in one short run (a lent GPU's time is scarce).

What it measures and checks, each section written to ``OUT/gpu.json`` as soon as it ends (so a run cut short
still reports what it reached), the table printed last:

- ``bare``: the ResNet-18-shaped CNN and the langid text model in a tight loop on prepared inputs, per batch size;
- ``saturation``: one in-process worker draining a full queue (overlap as shipped and off), with the GPU's
  utilisation sampled by NVML; ``processes``: 1, 2 and 4 ``inferq worker`` processes sharing the one GPU;
- ``http``: the real API and a worker process, one client (idle latency) and 64 clients, ``Prefer: wait``;
- ``peers``: the synchronous FastAPI peer and plain RQ running the same handler on the GPU;
- ``labels``: float16, bfloat16 and ``compile`` give float32's labels on the digits and langid demo models;
- ``oom``: a batch made too large on purpose runs out of device memory for real; the batch halves, no job fails;
- ``devices``: ``--device cuda:0`` serves, ``--device cuda:N`` past the last GPU exits 78 naming the count.

On a machine without CUDA it says so and exits 2: it never substitutes CPU figures.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from redis import Redis
from torch import nn

from bench.generators import python_loop
from bench.models import ROOT, build_models
from bench.procs import Processes, wait_http
from bench.run import payloads_for
from inferq.shared import keys
from inferq.shared.jobs import QueueCache, Submission, enqueue_job
from inferq.shared.lifecycle.info import JobInfo
from inferq.shared.models import ModelConfig, load_model_config
from inferq.shared.redis_server import RedisServer, free_port
from inferq.shared.settings import Settings
from inferq.workers.batching import BatchWorker
from inferq.workers.formats import save_export
from inferq.workers.running import ModelRunner, load_runner

log = logging.getLogger("bench.gpu")
RESNET_MAX_BATCH = 64
TEXT_MAX_BATCH = 64
# One item of the out-of-memory model materialises this many float32 values on the device (1 GiB).
OOM_ITEM_VALUES = 1 << 28
OOM_BATCH = 256
# `--dry-run` sets "cpu": the script's own smoke test on a machine without a GPU (its figures are not GPU figures).
DEVICE = "cuda:0"


class BlowUp(nn.Module):
    """Each item becomes a 1 GiB row on the device: a batch of 256 needs 256 GiB, more than any one GPU has."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        wide = x[:, :1].expand(-1, OOM_ITEM_VALUES) * 2.0
        return wide.sum(dim=1, keepdim=True) / OOM_ITEM_VALUES


class Gpu:
    """NVML utilisation sampled on a thread while a block runs: the mean and the samples' count."""

    def __init__(self) -> None:
        self.nvml: Any = None
        if DEVICE == "cpu":
            return
        import pynvml  # nvidia-ml-py, which torch.cuda.utilization() uses too

        pynvml.nvmlInit()
        self.nvml = pynvml
        self.handle = pynvml.nvmlDeviceGetHandleByIndex(torch.cuda.current_device())

    @contextmanager
    def sampled(self, into: dict[str, Any]) -> Iterator[None]:
        samples: list[int] = []
        memory: list[int] = []
        stop = threading.Event()

        def sample() -> None:
            while self.nvml is not None and not stop.is_set():
                samples.append(self.nvml.nvmlDeviceGetUtilizationRates(self.handle).gpu)
                memory.append(self.nvml.nvmlDeviceGetMemoryInfo(self.handle).used)
                stop.wait(0.02)

        thread = threading.Thread(target=sample, daemon=True)
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join()
            into["gpu_util_mean_pct"] = statistics.fmean(samples) if samples else None
            into["gpu_util_samples"] = len(samples)
            into["gpu_memory_max_mib"] = max(memory) / 2**20 if memory else None


def langid_texts(count: int) -> list[str]:
    """Held-out sentences of the langid demo (words it never saw in training)."""
    sys.path.insert(0, str(ROOT / "models" / "langid"))
    import train  # type: ignore[import-not-found]

    texts, _ = train.heldout_texts(count)
    return list(texts)


def digit_pngs() -> list[bytes]:
    return payloads_for("digits", 360)[0]


def bare(config: ModelConfig, payloads: list[bytes], content_type: str, sizes: list[int]) -> dict[str, Any]:
    """model(batch) in a loop on preprocessed, collated inputs; outputs back on the host, as a worker needs."""
    runner = load_runner(config, torch.device(DEVICE), max(sizes))
    handler = runner.handler
    items = [handler.preprocess(p, content_type) for p in payloads]
    points = []
    for size in sizes:
        batch_items = [items[i % len(items)] for i in range(size)]
        with torch.inference_mode():
            batch = handler.collate(batch_items)
            for _ in range(3):
                handler.uncollate(handler.predict(batch), size)
            if DEVICE != "cpu":
                torch.cuda.synchronize()
            runs, started = 0, time.perf_counter()
            while time.perf_counter() - started < 1.0 or runs < 10:
                handler.uncollate(handler.predict(batch), size)
                runs += 1
        per_batch_s = (time.perf_counter() - started) / runs
        points.append({"batch": size, "batch_ms": per_batch_s * 1000, "items_per_s": size / per_batch_s})
        log.info("bare %s batch %d: %.2f ms, %.0f items/s", config.name, size, per_batch_s * 1000, size / per_batch_s)
    started = time.perf_counter()
    for payload in payloads[:256]:
        handler.preprocess(payload, content_type)
    preprocess_ms = (time.perf_counter() - started) / min(256, len(payloads)) * 1000
    return {
        "points": points,
        "best_items_per_s": max(p["items_per_s"] for p in points),
        "preprocess_ms_per_item": preprocess_ms,
    }


def fill(
    connection: Redis, settings: Settings, model: str, payloads: list[bytes], content_type: str, jobs: int
) -> list[str]:
    queues = QueueCache(connection)
    return [
        enqueue_job(queues, settings, Submission(model, payloads[i % len(payloads)], content_type)).id
        for i in range(jobs)
    ]


def outcomes(connection: Redis, ids: list[str]) -> dict[str, Any]:
    """How many of the jobs ran, failed, and on which workers."""
    pipe = connection.pipeline(transaction=False)
    for job_id in ids:
        pipe.hgetall(keys.info_key(job_id))
    infos = [JobInfo.of({k.decode(): v.decode() for k, v in raw.items()}) for raw in pipe.execute()]
    workers: dict[str, int] = {}
    for info in infos:
        if info.worker:
            workers[info.worker] = workers.get(info.worker, 0) + 1
    sizes = [info.batch_size for info in infos if info.batch_size]
    return {
        "jobs": len(ids),
        "ran": sum(info.ran for info in infos),
        "failed": sum(info.error is not None for info in infos),
        "errors": sorted({info.error for info in infos if info.error})[:3],
        "workers": workers,
        "mean_batch": statistics.fmean(sizes) if sizes else None,
    }


def saturation(
    redis: RedisServer, gpu: Gpu, folder: Path, payloads: list[bytes], content_type: str, jobs: int
) -> dict[str, Any]:
    """One in-process worker draining ``jobs`` queued beforehand: overlap as shipped (auto: on for CUDA) and off."""
    connection = Redis.from_url(redis.url)
    out: dict[str, Any] = {"jobs": jobs}
    for overlap in ("auto", "off", "auto", "off"):
        settings = Settings(redis_url=redis.url, overlap=overlap)  # type: ignore[arg-type]
        config = load_model_config(folder)
        runner = load_runner(config, torch.device(DEVICE), config.max_batch)
        runner.handler.run([(payloads[0], content_type)] * config.max_batch)
        worker = BatchWorker(
            {config.name: runner}, connection=connection, settings=settings, name=f"sat-{overlap}-{time.monotonic_ns()}"
        )
        connection.flushall()
        ids = fill(connection, settings, config.name, payloads, content_type, jobs)
        point: dict[str, Any] = {}
        with gpu.sampled(point):
            started = time.perf_counter()
            worker.work(burst=True, logging_level="WARNING")
            point["items_per_s"] = jobs / (time.perf_counter() - started)
        point.update(outcomes(connection, ids))
        best = out.get(overlap)
        if best is None or point["items_per_s"] > best["items_per_s"]:
            out[overlap] = point
        log.info(
            "saturation %s overlap %s: %.0f items/s, GPU %.0f%%",
            config.name,
            overlap,
            point["items_per_s"],
            point["gpu_util_mean_pct"] or -1,
        )
    connection.flushall()
    return out


def start_worker(procs: Processes, name: str, *models: str) -> None:
    """An `inferq worker` process serving ``models`` on the GPU under test."""
    served = [arg for model in models for arg in ("--model", model)]
    procs.start(name, "inferq", "--log-level", "WARNING", "worker", *served, "--device", DEVICE)


def processes(redis: RedisServer, gpu: Gpu, tmp: Path, models_dir: Path, jobs: int) -> dict[str, Any]:
    """1, 2 and 4 `inferq worker` processes on the one GPU draining the same queue of ResNet JPEGs."""
    payloads, content_type = payloads_for("resnet", 32)
    connection = Redis.from_url(redis.url)
    settings = Settings(redis_url=redis.url)
    env = {"INFERQ_REDIS_URL": redis.url, "INFERQ_MODELS_DIR": str(models_dir), "INFERQ_JOB_TIMEOUT_S": "60"}
    out: dict[str, Any] = {"jobs": jobs}
    for count in (1, 2, 4):
        connection.flushall()
        procs = Processes(tmp, env)
        try:
            for n in range(count):
                start_worker(procs, f"gpu-worker-{count}-{n}", "resnet")
            deadline = time.monotonic() + 120
            while len(connection.smembers("rq:workers")) < count and time.monotonic() < deadline:
                time.sleep(0.2)
            time.sleep(1.0)
            point: dict[str, Any] = {"workers": count}
            with gpu.sampled(point):
                started = time.perf_counter()
                ids = fill(connection, settings, "resnet", payloads, content_type, jobs)
                queue = keys.queue_name("resnet")
                while time.monotonic() < deadline + 120:
                    done = outcomes(connection, ids[-50:])
                    if done["ran"] == 50 and connection.llen(f"rq:queue:{queue}") == 0:
                        break
                    time.sleep(0.05)
                point["items_per_s"] = jobs / (time.perf_counter() - started)
            point.update(outcomes(connection, ids))
            out[str(count)] = point
            log.info(
                "%d worker process(es): %.0f items/s, GPU %.0f%%, workers %s",
                count,
                point["items_per_s"],
                point["gpu_util_mean_pct"] or -1,
                point["workers"],
            )
        finally:
            procs.stop()
    connection.flushall()
    return out


def http(
    redis: RedisServer, gpu: Gpu, tmp: Path, models_dir: Path, texts: list[bytes], point_s: float
) -> dict[str, Any]:
    """Through the real API and one worker process: one client (idle latency) and 64 clients, one call each."""
    port = free_port()
    env = {
        "INFERQ_REDIS_URL": redis.url,
        "INFERQ_MODELS_DIR": str(models_dir),
        "INFERQ_JOB_TIMEOUT_S": "60",
        "INFERQ_RESULT_TTL_S": "30",
    }
    procs = Processes(tmp, env)
    base = f"http://127.0.0.1:{port}"
    out: dict[str, Any] = {}
    try:
        procs.start("gpu-api", "inferq", "--log-level", "WARNING", "api", "--port", str(port), "--workers", "2")
        start_worker(procs, "gpu-worker-http", "resnet", "langid")
        wait_http(f"{base}/readyz")
        time.sleep(8)
        for model, (payloads, content_type) in {
            "resnet": payloads_for("resnet", 32),
            "langid": (texts, "text/plain"),
        }.items():
            args = [base, f"/v1/models/{model}/jobs", content_type]
            python_loop("closed", "prefer_wait", args, payloads, 2.0, "warm", clients=4)
            for clients in (1, 64):
                point: dict[str, Any] = {}
                with gpu.sampled(point):
                    point.update(
                        python_loop(
                            "closed", "prefer_wait", args, payloads, point_s, f"{model} c={clients}", clients=clients
                        )
                    )
                out[f"{model} c={clients}"] = point
                log.info(
                    "http %s c=%d: %.0f/s p50 %s p99 %s",
                    model,
                    clients,
                    point["throughput_per_s"],
                    point["p50_ms"],
                    point["p99_ms"],
                )
    finally:
        procs.stop()
    return out


def peers(redis: RedisServer, gpu: Gpu, tmp: Path, models_dir: Path, point_s: float) -> dict[str, Any]:
    """The synchronous FastAPI app (model in the request, 2 processes) and plain RQ, the handler on the GPU."""
    out: dict[str, Any] = {}
    payloads, content_type = payloads_for("resnet", 32)
    for peer in ("sync_fastapi", "plain_rq"):
        port = free_port()
        procs = Processes(tmp, {"INFERQ_BENCH_DEVICE": DEVICE})
        base = f"http://127.0.0.1:{port}"
        module = f"bench.peers.{peer}"
        common = ["--model-dir", str(models_dir / "resnet")]
        try:
            if peer == "sync_fastapi":
                procs.start(peer, module, "api", "--port", str(port), "--workers", "2", "--threads", "1", *common)
            else:
                procs.start(f"{peer}-api", module, "api", "--port", str(port), "--redis-url", redis.url)
                procs.start(f"{peer}-worker", module, "worker", "--redis-url", redis.url, *common)
            wait_http(f"{base}/healthz")
            time.sleep(5)
            args = [base, "/jobs", content_type, "/jobs/{id}"]
            python_loop("closed", "submit_then_wait", args, payloads, 2.0, "warm", clients=4)
            for clients in (1, 64):
                point: dict[str, Any] = {}
                with gpu.sampled(point):
                    point.update(
                        python_loop(
                            "closed",
                            "submit_then_wait",
                            args,
                            payloads,
                            point_s,
                            f"{peer} c={clients}",
                            clients=clients,
                        )
                    )
                out[f"{peer} c={clients}"] = point
                log.info("peer %s c=%d: %.0f/s p50 %s", peer, clients, point["throughput_per_s"], point["p50_ms"])
        finally:
            procs.stop()
            Redis.from_url(redis.url).flushall()
    return out


def labels(texts: list[bytes]) -> dict[str, Any]:
    """Top-1 labels of every held-out input under float16, bfloat16 and compile, against float32's."""
    cases = {
        "digits": (ROOT / "models" / "digits", digit_pngs(), "image/png"),
        "langid": (ROOT / "models" / "langid", texts, "text/plain"),
    }
    out: dict[str, Any] = {}
    for name, (folder, payloads, content_type) in cases.items():
        base = load_model_config(folder)
        reference: list[Any] | None = None
        for variant, update in (
            ("float32", {}),
            ("float16", {"dtype": "float16"}),
            ("bfloat16", {"dtype": "bfloat16"}),
            ("compile", {"compile": True}),
        ):
            started = time.perf_counter()
            runner = load_runner(base.model_copy(update=update), torch.device(DEVICE), base.max_batch)
            load_s = time.perf_counter() - started
            got = []
            for i in range(0, len(payloads), base.max_batch):
                chunk = [(p, content_type) for p in payloads[i : i + base.max_batch]]
                got += [top1(result) for result in runner.handler.run(chunk)]
            if reference is None:
                reference = got
            same = sum(a == b for a, b in zip(reference, got, strict=True))
            out[f"{name} {variant}"] = {"inputs": len(got), "same_top1_as_float32": same, "load_s": load_s}
            log.info("labels %s %s: %d/%d as float32 (load %.1f s)", name, variant, same, len(got), load_s)
            del runner
            if DEVICE != "cpu":
                torch.cuda.empty_cache()
    return out


def top1(result: Any) -> Any:
    """The label of a classifier's answer (``{"label", "score", "top_k"}``), else the whole answer."""
    if isinstance(result, dict) and "label" in result:
        return result["label"]
    return json.dumps(result)


def oom(redis: RedisServer, tmp: Path) -> dict[str, Any]:
    """256 jobs queued for a model whose batch of 256 needs 256 GiB: a real CUDA out-of-memory, then halving."""
    folder = tmp / "blowup"
    folder.mkdir()
    save_export(BlowUp(), torch.zeros(2, 4), folder / "model.pt2")
    config = {
        "handler": "tensor",
        "format": "export",
        "weights": "model.pt2",
        "input": {"kind": "tensor", "shape": [4], "dtype": "float32"},
        "max_batch": OOM_BATCH,
    }
    (folder / "config.json").write_text(json.dumps(config))
    connection = Redis.from_url(redis.url)
    connection.flushall()
    settings = Settings(redis_url=redis.url, job_timeout_s=120)
    model = load_model_config(folder)
    runner = ModelRunner(model, load_runner(model, torch.device(DEVICE), 1).handler, torch.device(DEVICE), OOM_BATCH)
    body = [json.dumps({"inputs": [float(i), 1.0, 2.0, 3.0]}).encode() for i in range(OOM_BATCH)]
    ids = fill(connection, settings, model.name, body, "application/json", OOM_BATCH)
    records = Capture()
    logging.getLogger("workers").addHandler(records)
    started = time.perf_counter()
    worker = BatchWorker({model.name: runner}, connection=connection, settings=settings, name=f"oom-{os.getpid()}")
    worker.work(burst=True, logging_level="WARNING")
    logging.getLogger("workers").removeHandler(records)
    result = outcomes(connection, ids)
    result.update(
        {
            "seconds": time.perf_counter() - started,
            "max_batch_after": runner.max_batch,
            "log": [line for line in records.lines if "memory" in line][:5],
            "device_memory_gib": torch.cuda.get_device_properties(0).total_memory / 2**30,
        }
    )
    log.info("oom: %s", result)
    connection.flushall()
    del runner, worker
    torch.cuda.empty_cache()
    return result


class Capture(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def devices(redis: RedisServer, models_dir: Path) -> dict[str, Any]:
    """`inferq worker --device cuda:N`: the last GPU serves; one past it exits 78 with a line naming the count."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "INFERQ_REDIS_URL": redis.url, "INFERQ_MODELS_DIR": str(models_dir)}
    count = torch.cuda.device_count() if DEVICE != "cpu" else 1
    out: dict[str, Any] = {"device_count": count}
    for spec in (f"cuda:{count - 1}", f"cuda:{count}") if DEVICE != "cpu" else ("cpu", "cuda:0"):
        cmd = [sys.executable, "-m", "inferq", "worker", "--model", "digits", "--device", spec, "--burst"]
        done = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=120, check=False)
        lines = (done.stdout + done.stderr).strip().splitlines()
        out[spec] = {"exit": done.returncode, "last_line": lines[-1] if lines else ""}
        log.info("--device %s: exit %d: %s", spec, done.returncode, out[spec]["last_line"])
    return out


def _n(value: float | None, digits: int = 0) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def table(results: dict[str, Any]) -> str:
    """The figures that matter, in markdown."""
    lines = [f"GPU: {results.get('machine', {}).get('gpu')}  torch {results.get('machine', {}).get('torch')}", ""]
    for name, bare_result in results.get("bare", {}).items():
        points = ", ".join(
            f"b{p['batch']} {p['items_per_s']:.0f}/s ({p['batch_ms']:.2f} ms)" for p in bare_result["points"]
        )
        lines.append(f"- bare {name}: {points}; preprocess {bare_result['preprocess_ms_per_item']:.2f} ms/item")
    for name, sat in results.get("saturation", {}).items():
        for mode in ("auto", "off"):
            if mode in sat:
                p = sat[mode]
                lines.append(
                    f"- saturation {name} overlap {mode}: {p['items_per_s']:.0f}/s, GPU {_n(p['gpu_util_mean_pct'])}%, "
                    f"mean batch {p['mean_batch']}, ran {p['ran']}/{p['jobs']}, failed {p['failed']}"
                )
    for count, p in results.get("processes", {}).items():
        if isinstance(p, dict):
            lines.append(
                f"- {count} worker process(es): {p['items_per_s']:.0f}/s, GPU {_n(p['gpu_util_mean_pct'])}%, "
                f"ran {p['ran']}, failed {p['failed']}, per worker {sorted(p['workers'].values())}"
            )
    for section in ("http", "peers"):
        for label, p in results.get(section, {}).items():
            lines.append(
                f"- {section} {label}: {p['throughput_per_s']:.0f}/s, p50 {_n(p['p50_ms'], 1)} ms, "
                f"p99 {_n(p['p99_ms'], 1)} ms, GPU {_n(p['gpu_util_mean_pct'])}%, errors {p['errors']}"
            )
    for label, p in results.get("labels", {}).items():
        lines.append(f"- labels {label}: {p['same_top1_as_float32']}/{p['inputs']} as float32")
    if "ran" in results.get("oom", {}):
        p = results["oom"]
        lines.append(
            f"- oom: ran {p['ran']}/{p['jobs']}, failed {p['failed']}, "
            f"max_batch {OOM_BATCH} -> {p['max_batch_after']}; {p['log'][:2]}"
        )
    if "devices" in results:
        lines.append(f"- devices: {results['devices']}")
    for name, error in results.get("errors", {}).items():
        lines.append(f"- ERROR in {name}: {error}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    parser.add_argument("--point-seconds", type=float, default=5.0)
    parser.add_argument("--only", default="", help="comma-separated sections to run (default: all)")
    parser.add_argument("--dry-run", action="store_true", help="run on the CPU: a smoke test of this script only")
    args = parser.parse_args()
    global DEVICE
    if args.dry_run:
        DEVICE = "cpu"
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s", stream=sys.stdout)
    logging.getLogger("httpx").setLevel(logging.WARNING)
    if not torch.cuda.is_available() and not args.dry_run:
        print("no CUDA device: bench.gpu measures a GPU and never substitutes CPU figures", file=sys.stderr)
        raise SystemExit(2)
    args.out.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="inferq-gpu-"))
    models_dir = tmp / "models"
    build_models(models_dir, resnet_max_batch=RESNET_MAX_BATCH)
    for demo in ("digits", "langid"):
        subprocess.run(["cp", "-r", str(ROOT / "models" / demo), str(models_dir / demo)], check=True)
    gpu = Gpu()
    cuda = DEVICE != "cpu"
    results: dict[str, Any] = {
        "machine": {
            "gpu": torch.cuda.get_device_name(0) if cuda else "none (dry run on the CPU)",
            "torch": torch.__version__,
            "cuda": torch.version.cuda,
            "cpus": os.cpu_count(),
            "device_memory_gib": torch.cuda.get_device_properties(0).total_memory / 2**30 if cuda else None,
        },
        "errors": {},
    }
    redis = RedisServer(tmp / "redis", appendonly=False)
    redis.start()
    resnet_jpegs, jpeg = payloads_for("resnet", 32)
    texts = [t.encode() for t in langid_texts(200)]
    # A dry run on the CPU only proves the script: a tenth of the jobs.
    scale = 1 if cuda else 0.1
    sections: dict[str, Callable[[], Any]] = {
        "bare": lambda: {
            "resnet": bare(load_model_config(models_dir / "resnet"), resnet_jpegs, jpeg, [1, 8, 16, 32, 64]),
            "langid": bare(load_model_config(models_dir / "langid"), texts, "text/plain", [1, 16, 64]),
        },
        "saturation": lambda: {
            "resnet": saturation(redis, gpu, models_dir / "resnet", resnet_jpegs, jpeg, int(3000 * scale)),
            "langid": saturation(redis, gpu, models_dir / "langid", texts, "text/plain", int(6000 * scale)),
        },
        "labels": lambda: labels(texts),
        "oom": lambda: (
            oom(redis, tmp) if cuda else {"skipped": "a dry run on the CPU would take 256 GiB of host memory"}
        ),
        "devices": lambda: devices(redis, models_dir),
        "processes": lambda: processes(redis, gpu, tmp, models_dir, int(3000 * scale)),
        "http": lambda: http(redis, gpu, tmp, models_dir, texts, args.point_seconds),
        "peers": lambda: peers(redis, gpu, tmp, models_dir, args.point_seconds),
    }
    only = [s for s in args.only.split(",") if s]
    try:
        for name, run in sections.items():
            if only and name not in only:
                continue
            started = time.perf_counter()
            try:
                results[name] = run()
            except Exception as exc:  # one section's failure must not cost the others' figures
                log.exception("section %s failed", name)
                results["errors"][name] = f"{type(exc).__name__}: {exc}"
            log.info("section %s: %.1f s", name, time.perf_counter() - started)
            (args.out / "gpu.json").write_text(json.dumps(results, indent=2, default=str))
    finally:
        redis.stop()
        # The processes' logs in one file: what comes back from a lent machine is counted in files.
        subprocess.run(
            ["tar", "czf", str(args.out / "logs.tgz"), "-C", str(tmp), *[p.name for p in tmp.glob("*.log")]],
            check=False,
        )
        shutil.rmtree(tmp, ignore_errors=True)
    try:
        text = table(results)
    except Exception as exc:  # the JSON is written already; the table is a summary of it
        text = f"table failed ({exc!r}); see gpu.json"
    (args.out / "gpu.md").write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
