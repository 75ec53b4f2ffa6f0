"""Bulk batches and lanes in `make bench`: the cost per item of a bulk drain against single jobs, and
interactive latency while a bulk run drains."""

from __future__ import annotations

import base64
import json
import logging
import os
import statistics
import time
from pathlib import Path
from typing import Any

import httpx
import torch
from redis import Redis

from inferq.shared import keys
from inferq.shared.jobs import QueueCache, Submission, enqueue_job, new_job_id
from inferq.shared.lifecycle import bulk
from inferq.shared.lifecycle.bulk import BulkItem, NewBatch
from inferq.shared.models import load_model_config
from inferq.shared.settings import Settings
from inferq.workers.batching import BatchWorker
from inferq.workers.handlers import load_handler
from inferq.workers.running import ModelRunner

log = logging.getLogger("bench")


def _worker(connection: Redis, settings: Settings, model_dir: Path, name: str) -> BatchWorker:
    config = load_model_config(model_dir)
    handler = load_handler(config, torch.device("cpu"))
    handler.load()
    runner = ModelRunner(config, handler, torch.device("cpu"), config.max_batch)
    return BatchWorker({config.name: runner}, connection=connection, settings=settings, name=name)


def bulk_vs_singles(redis_url: str, model_dir: Path, items: int) -> dict[str, Any]:
    """Submit and drain ``items`` no-op inputs as single jobs, then as one bulk batch: seconds per item."""
    connection = Redis.from_url(redis_url)
    settings = Settings(redis_url=redis_url, max_queue_length=max(items, 1) * 2)  # all of them queued at once
    model = model_dir.name
    payloads = [json.dumps({"inputs": [i, 1.0, 2.0, 3.0]}).encode() for i in range(8)]
    chunk = load_model_config(model_dir).max_batch

    connection.flushall()
    queues = QueueCache(connection)
    started = time.perf_counter()
    for i in range(items):
        enqueue_job(queues, settings, Submission(model, payloads[i % 8], "application/json"))
    submitted = time.perf_counter()
    _worker(connection, settings, model_dir, f"bench-singles-{os.getpid()}").work(burst=True, logging_level="WARNING")
    singles = {"submit_s": submitted - started, "drain_s": time.perf_counter() - submitted}

    connection.flushall()
    batch_items = [BulkItem(f"i{i}", payloads[i % 8], "application/json") for i in range(items)]
    started = time.perf_counter()
    new = NewBatch(new_job_id(), model, keys.BULK, chunk_size=chunk, result_ttl_s=600, items=batch_items)
    bulk.enqueue_batch(connection, settings, new)
    submitted = time.perf_counter()
    _worker(connection, settings, model_dir, f"bench-bulk-{os.getpid()}").work(burst=True, logging_level="WARNING")
    batch = {"submit_s": submitted - started, "drain_s": time.perf_counter() - submitted}
    view = bulk.read_batch(connection, new.id)
    assert view is not None and view["counts"]["finished"] == items, view
    connection.flushall()
    connection.close()
    per_single = (singles["submit_s"] + singles["drain_s"]) / items
    per_bulk = (batch["submit_s"] + batch["drain_s"]) / items
    log.info("bulk drain: %.1f us/item vs %.1f us/item as single jobs", per_bulk * 1e6, per_single * 1e6)
    return {
        "items": items,
        "singles": singles,
        "bulk": batch,
        "single_us_per_item": per_single * 1e6,
        "bulk_us_per_item": per_bulk * 1e6,
        "ratio": per_single / per_bulk,
    }


def lanes_latency(base: str, model: str, images: list[bytes], content_type: str, items: int) -> dict[str, Any]:
    """One client's `Prefer: wait` latency idle, then while a bulk batch of ``items`` images drains."""
    with httpx.Client(base_url=base, timeout=120) as client:

        def one() -> float:
            started = time.perf_counter()
            response = client.post(
                f"/v1/models/{model}/jobs",
                content=images[0],
                headers={"content-type": content_type, "prefer": "wait=60"},
            )
            assert response.status_code == 200, response.text
            return (time.perf_counter() - started) * 1000

        idle = [one() for _ in range(20)]
        lines = b"".join(
            json.dumps({"custom_id": str(i), "image": base64.b64encode(images[i % len(images)]).decode()}).encode()
            + b"\n"
            for i in range(items)
        )
        accepted = client.post(
            f"/v1/models/{model}/batches", content=lines, headers={"content-type": "application/jsonl"}
        )
        assert accepted.status_code == 202, accepted.text
        batch_id = accepted.json()["id"]
        during: list[float] = []
        status = "queued"
        while status != "finished":
            during.append(one())
            status = client.get(f"/v1/batches/{batch_id}").json()["status"]
        view = client.get(f"/v1/batches/{batch_id}").json()
    result = {
        "items": items,
        "idle_p50_ms": statistics.median(idle),
        "during_p50_ms": statistics.median(during),
        "samples_during": len(during),
        "bulk_finished": view["counts"]["finished"],
        "bulk_items_per_s": view["items_per_s"],
    }
    log.info("lanes: p50 %.1f ms idle, %.1f ms during a bulk drain", result["idle_p50_ms"], result["during_p50_ms"])
    return result
