"""A runner that ends a version's jobs when no worker can load the version any more, rather than leave them.

`inferq up` starts a drainer in place of a draining worker that died with jobs left in its queues (a version
removed from the repository, whose worker was killed mid-drain). When the version's files went with it, the
drainer cannot load the model: its jobs then fail, each saying why, through the worker's own finish (its event, its
webhook, its metrics), instead of waiting for good for a worker that can never start.
"""

from __future__ import annotations

from typing import Any

import torch

from inferq.shared.errors import AppError
from inferq.shared.models import ModelConfig
from inferq.workers.handlers import Handler
from inferq.workers.running import ModelRunner


class _Unloadable(Handler):
    """Fails every item with ``reason``; loads nothing."""

    def __init__(self, config: ModelConfig, reason: str) -> None:
        super().__init__(config, torch.device("cpu"))
        self.reason = reason

    def load(self) -> None:
        pass

    def preprocess(self, payload: bytes, content_type: str) -> Any:
        raise AppError(self.reason)


def ending_runner(config: ModelConfig, load_error: str) -> ModelRunner:
    """A runner of ``config``'s version that fails each of its jobs, naming ``load_error``."""
    reason = (
        f"version {config.version} of model {config.name!r} left the repository before this job ran, and no worker "
        f"can load it any more: {load_error}"
    )
    return ModelRunner(config, _Unloadable(config, reason), torch.device("cpu"), config.max_batch)
