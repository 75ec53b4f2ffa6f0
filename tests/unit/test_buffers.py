"""Image batches written in place (workers.buffers), here or by feeder processes (workers.feeders): the batch a
built-in image handler's model sees is exactly ``preprocess`` then ``stack``, in reused buffers, one bad image
failing alone with the worker's own error, a feeder killed mid-batch losing none; a handler's own preprocess keeps
its own path. No Redis."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from io import BytesIO
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import numpy as np
import pytest
import torch
from PIL import Image

from inferq.shared.models import load_model_config
from inferq.workers import buffers
from inferq.workers.feeders import Feeders
from inferq.workers.handlers import DEFAULT_MAX_IMAGE_PIXELS, ImageClassifier
from inferq.workers.running import Item, ModelRunner, load_runner, prepare, run_batch, run_prepared
from tests.support.builders import write_config

CPU = torch.device("cpu")
RGB_INPUT = {"kind": "image", "mode": "RGB", "size": [16, 12], "mean": [0.4, 0.5, 0.6], "std": [0.2, 0.25, 0.3]}
POISON = 255  # an all-white image: the model below fails on any batch holding one


class Sums(ImageClassifier):
    """An image handler overriding only load and predict (as docs/serving.md's users do): each image's channel
    sums, recording every batch the model saw; a batch holding an all-white image fails."""

    def load(self) -> None:
        self.seen: list[torch.Tensor] = []
        self.model = None

    def predict(self, batch: torch.Tensor) -> torch.Tensor:
        self.seen.append(batch.clone())
        if bool((batch[:, 0].amin(dim=(1, 2)) == batch.new_tensor(self._white)).any()):
            raise RuntimeError("a white image")
        return batch.flatten(2).sum(-1)

    @property
    def _white(self) -> float:
        return float(np.float32(POISON) * self._scale[0, 0, 0] + self._shift[0, 0, 0])


class OwnPreprocess(Sums):
    """Its own preprocess: the batch is its items stacked, as before."""

    def preprocess(self, payload: bytes, content_type: str) -> torch.Tensor:
        return super().preprocess(payload, content_type) * 2


def _image(seed: int, size: tuple[int, int] = (20, 15), fmt: str = "JPEG", white: bool = False) -> bytes:
    pixels = np.random.default_rng(seed).integers(0, 255, (size[1], size[0], 3), dtype=np.uint8)
    buffer = BytesIO()
    Image.fromarray(np.full_like(pixels, POISON) if white else pixels, mode="RGB").save(buffer, format=fmt)
    return buffer.getvalue()


def _items(payloads: list[bytes], content_type: str = "image/jpeg") -> list[Item]:
    return [Item(cast(Any, SimpleNamespace(id=f"job-{n}")), p, content_type) for n, p in enumerate(payloads)]


def _runner(tmp_path: Path, handler: type[Sums] = Sums, max_batch: int = 8) -> ModelRunner:
    spec = f"{__name__}:{handler.__name__}"
    folder = write_config(tmp_path / "m", handler=spec, weights="none", input=RGB_INPUT, max_batch=max_batch)
    return load_runner(load_model_config(folder), CPU, max_batch)


@pytest.mark.parametrize("channels_last", [False, True])
def test_the_batch_written_in_place_is_preprocess_then_stack(tmp_path: Path, channels_last: bool) -> None:
    runner = _runner(tmp_path)
    runner.channels_last = channels_last
    payloads = [_image(n, size=(20 + n, 15 + 2 * n), fmt="JPEG" if n % 2 else "PNG") for n in range(6)]
    prepared = prepare(runner, _items(payloads))
    ((group, batch, error),) = prepared.groups
    assert error is None and len(group) == 6
    expected = torch.stack([runner.handler.preprocess(p, "image/jpeg") for p in payloads])
    assert torch.equal(batch, expected)
    assert batch.is_contiguous(memory_format=torch.channels_last if channels_last else torch.contiguous_format)
    assert len(prepared.leases) == 1 and batch.data_ptr() == prepared.leases[0].tensor.data_ptr()  # no copy


def test_batches_reuse_their_buffers(tmp_path: Path) -> None:
    runner = _runner(tmp_path)
    for round_ in range(10):
        items = _items([_image(round_ * 10 + n) for n in range(1 + round_ % 8)])
        run_batch(runner, items)
        assert all(item.error is None for item in items)
    assert runner.buffers.made == 1
    # Prepared side by side (the overlap prepares the next batch while this one runs): a buffer each, then reused.
    first, second = prepare(runner, _items([_image(1)])), prepare(runner, _items([_image(2)]))
    assert runner.buffers.made == 2
    assert first.groups[0][1].data_ptr() != second.groups[0][1].data_ptr()
    run_prepared(runner, first)
    run_prepared(runner, second)
    run_batch(runner, _items([_image(3)]))
    assert runner.buffers.made == 2


def test_each_item_gets_the_answer_it_gets_alone(tmp_path: Path) -> None:
    runner = _runner(tmp_path)
    payloads = [_image(n) for n in range(5)]
    items = _items(payloads[:2] + [b"not an image"] + payloads[2:])
    run_batch(runner, items)
    assert "could not decode image" in (items[2].error or "")
    alone = [runner.handler.run([(p, "image/jpeg")])[0] for p in payloads]
    assert [item.output for n, item in enumerate(items) if n != 2] == alone


def test_a_batch_the_model_fails_is_split_to_the_guilty_image(tmp_path: Path) -> None:
    """Bisecting collates the items again from their rows of the buffer: the others still get their own answers."""
    runner = _runner(tmp_path)
    payloads = [_image(n, fmt="PNG") for n in range(4)]
    items = _items([*payloads[:3], _image(9, fmt="PNG", white=True), payloads[3]], "image/png")
    run_batch(runner, items)
    assert [item.error is None for item in items] == [True, True, True, False, True]
    assert "a white image" in (items[3].error or "")
    alone = [runner.handler.run([(p, "image/png")])[0] for p in payloads]
    assert [item.output for n, item in enumerate(items) if n != 3] == alone


def test_only_the_built_in_preprocessing_is_written_in_place(tmp_path: Path) -> None:
    runner = _runner(tmp_path, Sums)
    assert buffers.filler(runner.handler) is runner.handler
    own = _runner(tmp_path / "own", OwnPreprocess)
    assert buffers.filler(own.handler) is None
    payloads = [_image(n) for n in range(3)]
    prepared = prepare(own, _items(payloads))
    expected = torch.stack([own.handler.preprocess(p, "image/jpeg") for p in payloads])
    assert torch.equal(prepared.groups[0][1], expected) and prepared.leases == []


@pytest.fixture(scope="module")
def fed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ModelRunner]:
    """A runner whose images two feeder processes decode."""
    runner = _runner(tmp_path_factory.mktemp("fed"))
    runner.feeders = Feeders(runner.config, 2, DEFAULT_MAX_IMAGE_PIXELS)
    yield runner
    runner.feeders.close()
    runner.buffers.close()


def _alone_in_process(tmp_path: Path, payloads: list[bytes]) -> list[Item]:
    items = _items(payloads)
    run_batch(_runner(tmp_path), items)
    return items


@pytest.mark.parametrize("channels_last", [False, True])
def test_feeders_write_the_batch_the_worker_would(fed: ModelRunner, channels_last: bool) -> None:
    fed.channels_last = channels_last
    payloads = [_image(n, size=(20 + n, 15 + n), fmt="PNG" if n % 3 else "JPEG") for n in range(7)]
    prepared = prepare(fed, _items(payloads))
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
    payloads = [_image(0), b"not an image", _image(1), huge.getvalue(), _image(2)]
    fed.handler.max_image_pixels = DEFAULT_MAX_IMAGE_PIXELS
    items = _items(payloads)
    run_batch(fed, items)
    here = _alone_in_process(tmp_path, payloads)
    assert [item.error for item in items] == [item.error for item in here]
    assert [item.input_refused for item in items] == [item.input_refused for item in here]
    assert items[1].error and "could not decode image" in items[1].error and "Traceback" in (items[1].traceback or "")
    assert [item.output for item in items] == [item.output for item in here]
    assert all(item.output is not None for n, item in enumerate(items) if n in (0, 2, 4))
    assert fed.feeders is not None and fed.feeders.deaths == 0


def test_a_feeder_killed_mid_batch_loses_no_image(fed: ModelRunner, tmp_path: Path) -> None:
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
    payloads = [_image(n) for n in range(12)]
    items = _items(payloads)
    run_batch(fed, items)
    assert feeders.deaths == 1
    assert [item.output for item in items] == [item.output for item in _alone_in_process(tmp_path, payloads)]
    # The next batch goes to feeders started again.
    again = _items(payloads[:3])
    run_batch(fed, again)
    assert feeders.deaths == 1 and feeders._pool is not None and feeders._pool is not pool
    assert all(item.error is None for item in again)
