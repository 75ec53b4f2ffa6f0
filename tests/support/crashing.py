"""A test model handler that kills its worker while loading, as a segfault or an OOM kill would."""

from __future__ import annotations

import os

from inferq.workers.handlers import TensorHandler


class Crash(TensorHandler):
    """Exits with status 3 from load(): no Python exception, so not a config error (78)."""

    def load(self) -> None:
        os._exit(3)
