"""A test model handler: echoes a 2-vector, slowly, and fails on a poison value."""

from __future__ import annotations

import os
import time

import torch

from workers.handlers import TensorHandler

POISON = 666.0


class SlowEcho(TensorHandler):
    """Sleeps ``INFERQ_TEST_SLOW_S`` per batch so tests can act while a batch runs."""

    def load(self) -> None:
        self.delay_s = float(os.environ.get("INFERQ_TEST_SLOW_S", "0"))

    def predict(self, batch: torch.Tensor) -> torch.Tensor:
        time.sleep(self.delay_s)
        if bool((batch == POISON).any()):
            raise RuntimeError("poison value in the batch")
        return batch * 1.0
