"""The echo test model: a handler that echoes a 2-vector, slowly, and fails on a poison value; its inputs, one by one
or as a bulk JSONL; and in-process runners and batch workers of it.

Configs name the handler by its dotted path, ``tests.support.echo:SlowEcho``; worker processes load it from there.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import redis as redis_py
import torch

from inferq.shared.jobs import QueueCache, Submission, enqueue_job, new_job_id
from inferq.shared.lifecycle.bulk import BulkItem
from inferq.shared.models import ModelConfig, TensorInput
from inferq.shared.settings import Settings
from inferq.workers.batching import BatchWorker
from inferq.workers.handlers import TensorHandler
from inferq.workers.running import ModelRunner

POISON = 666.0
BULK_QUEUE = "rq:queue:inferq.echo.bulk"
JSONL = {"content-type": "application/jsonl"}


class SlowEcho(TensorHandler):
    """Sleeps ``INFERQ_TEST_SLOW_S`` per batch so tests can act while a batch runs."""

    def load(self) -> None:
        self.delay_s = float(os.environ.get("INFERQ_TEST_SLOW_S", "0"))

    def predict(self, batch: torch.Tensor) -> torch.Tensor:
        time.sleep(self.delay_s)
        if bool((batch == POISON).any()):
            raise RuntimeError("poison value in the batch")
        return batch * 1.0


class Flaky(TensorHandler):
    """Fails every item whose first value is a multiple of 5: a fifth of the inputs 1, 2, 3…, each alone (the batch
    is split to isolate them, as for any bad item)."""

    def load(self) -> None:  # no weights: it computes its answer
        pass

    def predict(self, batch: torch.Tensor) -> torch.Tensor:
        if bool((batch[:, 0] % 5 == 0).any()):
            raise RuntimeError("this version fails on multiples of 5")
        return batch * 1.0


def echo_runner(max_batch: int = 16) -> ModelRunner:
    config = ModelConfig(
        name="echo",
        path=Path("."),
        handler="tests.support.echo:SlowEcho",
        input=TensorInput(shape=[2], dtype="float32"),
        max_batch=max_batch,
    )
    handler = SlowEcho(config, torch.device("cpu"))
    handler.load()
    return ModelRunner(config, handler, torch.device("cpu"), max_batch)


def echo_worker(redis: redis_py.Redis, settings: Settings, max_batch: int = 1) -> BatchWorker:
    return BatchWorker(
        {"echo": echo_runner(max_batch)}, connection=redis, settings=settings, name=f"w{new_job_id()[:6]}"
    )


def submit_echo(redis: redis_py.Redis, settings: Settings, values: list[float]) -> str:
    payload = json.dumps({"inputs": values}).encode()
    return enqueue_job(QueueCache(redis), settings, Submission("echo", payload, "application/json")).id


def echo_items(count: int, prefix: str = "item") -> list[BulkItem]:
    payloads = [json.dumps({"inputs": [i, i]}).encode() for i in range(count)]
    return [BulkItem(f"{prefix}-{i}", payload, "application/json") for i, payload in enumerate(payloads)]


def echo_jsonl(count: int, prefix: str = "item") -> bytes:
    return b"".join(json.dumps({"custom_id": f"{prefix}-{i}", "inputs": [i, i]}).encode() + b"\n" for i in range(count))


class Weighed(SlowEcho):
    """``SlowEcho`` that reads its weights file at load, as a real model does: no worker loads it once it is gone."""

    def load(self) -> None:
        super().load()
        self.config.weights_path.read_bytes()
