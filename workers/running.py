"""Running one batch through a model: per-item preprocessing, one forward pass, per-item output.

No Redis here: ``workers.batching`` loads the batch and stores what this module produced.
"""

from __future__ import annotations

import json
import logging
import time
import traceback
from dataclasses import dataclass, field
from typing import Any

import torch

from shared.errors import AppError
from shared.models import ModelConfig
from shared.rqjson import JSONJob
from workers.handlers import Handler, move_batch

log = logging.getLogger(__name__)


@dataclass
class ModelRunner:
    """A loaded model and how to batch it."""

    config: ModelConfig
    handler: Handler
    device: torch.device
    max_batch: int


@dataclass
class Item:
    """One job of a batch and what happened to it."""

    job: JSONJob
    payload: bytes | None
    content_type: str
    info: dict[str, str] = field(default_factory=dict)
    execution: Any = None
    tensor: torch.Tensor | None = None
    output: Any = None
    error: str | None = None
    traceback: str | None = None

    def fail(self, reason: str, exc: BaseException | None = None) -> None:
        self.error = reason
        self.traceback = "".join(traceback.format_exception(exc)) if exc is not None else reason


def readable(exc: BaseException) -> str:
    """A short reason a client can read."""
    if isinstance(exc, AppError):
        return exc.message
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


def run_batch(runner: ModelRunner, items: list[Item]) -> float:
    """Fill each item's output or error; returns the batch's inference time in ms."""
    started = time.perf_counter()
    for item in items:
        if item.payload is None:
            item.fail("the job's input expired before it ran")
            continue
        try:
            item.tensor = runner.handler.preprocess(item.payload, item.content_type)
        except Exception as exc:  # one bad item fails only its own job
            item.fail(readable(exc), exc)
    _predict(runner, [item for item in items if item.error is None])
    return (time.perf_counter() - started) * 1000.0


def _predict(runner: ModelRunner, items: list[Item]) -> None:
    """Run a batch; if the whole batch fails, split it so only the guilty item fails."""
    if not items:
        return
    try:
        batch = move_batch(torch.stack([item.tensor for item in items]), runner.device)  # type: ignore[misc]
        outputs = runner.handler.predict(batch)
        if len(outputs) != len(items):
            raise RuntimeError(f"model returned {len(outputs)} rows for {len(items)} inputs")
        outputs = outputs.detach().to("cpu")
    except Exception as exc:
        if len(items) == 1:
            log.exception("model failed on job %s", items[0].job.id)
            items[0].fail(f"model failed on this input: {readable(exc)}", exc)
            return
        log.warning("batch of %d failed (%s); splitting to isolate the bad item", len(items), exc)
        half = len(items) // 2
        _predict(runner, items[:half])
        _predict(runner, items[half:])
        return
    for item, row in zip(items, outputs, strict=True):
        try:
            output = runner.handler.postprocess(row)
            json.dumps(output, allow_nan=False)  # the result must be storable as strict JSON
            item.output = output
        except Exception as exc:
            item.fail(f"could not encode the output: {readable(exc)}", exc)
