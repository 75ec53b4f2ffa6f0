"""RQ's own SimpleWorker running one job per request: the drain-rate baseline."""

from __future__ import annotations

import base64
import os
import time
from functools import lru_cache
from pathlib import Path
from typing import Any

import torch
from redis import Redis
from rq import Queue, SimpleWorker
from rq.serializers import JSONSerializer

from shared.models import load_model_config
from workers.handlers import Handler, load_handler

QUEUE = "bench-rq"
# The worker process's model, set once before it works (the job names no path).
MODEL_DIR = {"path": ""}


@lru_cache(maxsize=4)
def _handler(model_dir: str) -> Handler:
    handler = load_handler(load_model_config(Path(model_dir)), torch.device("cpu"))
    handler.load()
    return handler


def run_item(payload_b64: str, content_type: str) -> Any:
    """One request, one job, a batch of one: how RQ users run a model."""
    handler = _handler(MODEL_DIR["path"])
    tensor = handler.preprocess(base64.b64decode(payload_b64), content_type)
    return handler.postprocess(handler.predict(tensor.unsqueeze(0))[0])


def drain_rate(connection: Redis, model_dir: Path, payloads: list[bytes], content_type: str) -> float:
    """Jobs per second one SimpleWorker drains from a queue filled beforehand."""
    MODEL_DIR["path"] = str(model_dir)
    _handler(str(model_dir))  # loaded before the clock starts, like inferq's worker
    queue = Queue(QUEUE, connection=connection, serializer=JSONSerializer)
    for payload in payloads:
        queue.enqueue(run_item, base64.b64encode(payload).decode(), content_type, result_ttl=600, ttl=600)
    worker = SimpleWorker([queue], connection=connection, serializer=JSONSerializer, name=f"bench-rq-{os.getpid()}")
    started = time.perf_counter()
    worker.work(burst=True, logging_level="WARNING")
    return len(payloads) / (time.perf_counter() - started)
