"""Feeders (workers.feeders): spawned processes that decode and normalise a built-in image model's batches into
shared buffers write exactly the batch the worker would; a bad image fails alone with the worker's own error; a
feeder killed mid-batch loses no image; feeders end with their worker, even one killed with SIGKILL. No Redis."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from io import BytesIO
from pathlib import Path
from typing import Any

import pytest
import torch
from PIL import Image

from inferq.workers.feeders import Feeders
from inferq.workers.handlers import DEFAULT_MAX_IMAGE_PIXELS
from inferq.workers.running import Item, ModelRunner, prepare, run_batch, run_prepared
from tests.support import imaging
from tests.support.models import ROOT
from tests.support.waiting import wait_until


@pytest.fixture(scope="module")
def fed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ModelRunner]:
    """A runner whose images two feeder processes decode."""
    runner = imaging.runner(tmp_path_factory.mktemp("fed"))
    runner.feeders = Feeders(runner.config, 2, DEFAULT_MAX_IMAGE_PIXELS)
    yield runner
    runner.feeders.close()
    runner.buffers.close()


def _alone_in_process(tmp_path: Path, payloads: list[bytes]) -> list[Item]:
    items = imaging.items(payloads)
    run_batch(imaging.runner(tmp_path), items)
    return items


@pytest.mark.parametrize("channels_last", [False, True])
def test_feeders_write_the_batch_the_worker_would(fed: ModelRunner, channels_last: bool) -> None:
    fed.channels_last = channels_last
    payloads = [imaging.image(n, size=(20 + n, 15 + n), fmt="PNG" if n % 3 else "JPEG") for n in range(7)]
    prepared = prepare(fed, imaging.items(payloads))
    ((group, batch, error),) = prepared.groups
    assert error is None and len(group) == 7 and prepared.leases[0].buffer.segment is not None
    assert torch.equal(batch, torch.stack([fed.handler.preprocess(p, "image/jpeg") for p in payloads]))
    run_prepared(fed, prepared)
    fed.channels_last = False
    assert fed.feeders is not None and fed.feeders.deaths == 0  # filled by the feeders, not in this process


def test_a_bad_image_fails_alone_with_the_workers_own_error(fed: ModelRunner, tmp_path: Path) -> None:
    """Its row closed up: the model sees the good images only, each answered as alone."""
    huge = BytesIO()
    Image.new("RGB", (3000, 3000)).save(huge, format="PNG")
    payloads = [imaging.image(0), b"not an image", imaging.image(1), huge.getvalue(), imaging.image(2)]
    fed.handler.max_image_pixels = DEFAULT_MAX_IMAGE_PIXELS
    items = imaging.items(payloads)
    run_batch(fed, items)
    here = _alone_in_process(tmp_path, payloads)
    assert [item.error for item in items] == [item.error for item in here]
    assert [item.input_refused for item in items] == [item.input_refused for item in here]
    assert items[1].error and "could not decode image" in items[1].error and "Traceback" in (items[1].traceback or "")
    assert [item.output for item in items] == [item.output for item in here]
    assert all(item.output is not None for n, item in enumerate(items) if n in (0, 2, 4))
    assert fed.feeders is not None and fed.feeders.deaths == 0


def test_a_feeder_killed_mid_batch_loses_noimage(fed: ModelRunner, tmp_path: Path) -> None:
    feeders = fed.feeders
    assert feeders is not None
    pool = feeders._pool
    assert pool is not None
    submit = pool.submit

    def submit_then_kill(fn: Any, *args: Any) -> Any:
        future = submit(fn, *args)
        for process in list(pool._processes.values()):  # type: ignore[attr-defined]
            os.kill(process.pid, signal.SIGKILL)
        return future

    pool.submit = submit_then_kill  # type: ignore[method-assign]
    payloads = [imaging.image(n) for n in range(12)]
    items = imaging.items(payloads)
    run_batch(fed, items)
    assert feeders.deaths == 1
    assert [item.output for item in items] == [item.output for item in _alone_in_process(tmp_path, payloads)]
    # The next batch goes to feeders started again.
    again = imaging.items(payloads[:3])
    run_batch(fed, again)
    assert feeders.deaths == 1 and feeders._pool is not None and feeders._pool is not pool
    assert all(item.error is None for item in again)


# A worker's process as far as its feeders go: it starts them for the model in argv[1], prints their pids, waits.
_HOLDER = """
import sys, time
from pathlib import Path
from inferq.shared.models import load_model_config
from inferq.workers.feeders import Feeders
feeders = Feeders(load_model_config(Path(sys.argv[1])), 2, 40_000_000)
print(" ".join(str(p.pid) for p in feeders._pool._processes.values()), flush=True)
time.sleep(600)
"""


def test_feeders_end_with_a_worker_killed_with_sigkill(fed: ModelRunner) -> None:
    """A worker killed with SIGKILL left its feeders running, each with its memory, after inferq up had started a
    new worker in its place."""
    with subprocess.Popen(
        [sys.executable, "-c", _HOLDER, str(fed.config.path)], cwd=ROOT, stdout=subprocess.PIPE, text=True
    ) as holder:
        assert holder.stdout is not None
        pids = [int(pid) for pid in holder.stdout.readline().split()]
        assert len(pids) == 2 and all(_alive(pid) for pid in pids)
        holder.kill()
    wait_until(lambda: not any(_alive(pid) for pid in pids), 30, "the feeders to end with their worker")


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs: neither gone nor a zombie waiting for its new parent to reap it."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False
