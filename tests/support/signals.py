"""The test process's own stop handlers, kept: an in-process RQ worker installs its own for SIGINT and SIGTERM
(rq's ``Worker._install_signal_handlers``) and never puts them back, so a Ctrl-C later in the run raised
``StopRequested`` in whichever unrelated test was running instead of stopping pytest."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from contextlib import contextmanager

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


@contextmanager
def kept_signal_handlers() -> Iterator[None]:
    """Whatever the body installs for SIGINT and SIGTERM is undone when it ends."""
    saved = {sig: signal.getsignal(sig) for sig in STOP_SIGNALS}
    try:
        yield
    finally:
        for sig, handler in saved.items():
            if handler is not None:  # None: installed outside Python, nothing to put back
                signal.signal(sig, handler)
