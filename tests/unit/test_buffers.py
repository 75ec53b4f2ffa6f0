"""Image batches written in place (workers.buffers): the batch a built-in image handler's model sees is exactly
``preprocess`` then ``stack``, in reused buffers, one bad image failing alone; a handler's own preprocess keeps its
own path. No Redis; the feeders' processes are tests/e2e/test_feeders.py's."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from inferq.workers import buffers
from inferq.workers.running import prepare, run_batch, run_prepared
from tests.support import imaging
from tests.support.imaging import OwnPreprocess, Sums


@pytest.mark.parametrize("channels_last", [False, True])
def test_the_batch_written_in_place_is_preprocess_then_stack(tmp_path: Path, channels_last: bool) -> None:
    runner = imaging.runner(tmp_path)
    runner.channels_last = channels_last
    payloads = [imaging.image(n, size=(20 + n, 15 + 2 * n), fmt="JPEG" if n % 2 else "PNG") for n in range(6)]
    prepared = prepare(runner, imaging.items(payloads))
    ((group, batch, error),) = prepared.groups
    assert error is None and len(group) == 6
    expected = torch.stack([runner.handler.preprocess(p, "image/jpeg") for p in payloads])
    assert torch.equal(batch, expected)
    assert batch.is_contiguous(memory_format=torch.channels_last if channels_last else torch.contiguous_format)
    assert len(prepared.leases) == 1 and batch.data_ptr() == prepared.leases[0].tensor.data_ptr()  # no copy


def test_batches_reuse_their_buffers(tmp_path: Path) -> None:
    runner = imaging.runner(tmp_path)
    for round_ in range(10):
        items = imaging.items([imaging.image(round_ * 10 + n) for n in range(1 + round_ % 8)])
        run_batch(runner, items)
        assert all(item.error is None for item in items)
    assert runner.buffers.made == 1
    # Prepared side by side (the overlap prepares the next batch while this one runs): a buffer each, then reused.
    first, second = (
        prepare(runner, imaging.items([imaging.image(1)])),
        prepare(runner, imaging.items([imaging.image(2)])),
    )
    assert runner.buffers.made == 2
    assert first.groups[0][1].data_ptr() != second.groups[0][1].data_ptr()
    run_prepared(runner, first)
    run_prepared(runner, second)
    run_batch(runner, imaging.items([imaging.image(3)]))
    assert runner.buffers.made == 2


def test_each_item_gets_the_answer_it_gets_alone(tmp_path: Path) -> None:
    runner = imaging.runner(tmp_path)
    payloads = [imaging.image(n) for n in range(5)]
    items = imaging.items(payloads[:2] + [b"not an image"] + payloads[2:])
    run_batch(runner, items)
    assert "could not decode image" in (items[2].error or "")
    alone = [runner.handler.run([(p, "image/jpeg")])[0] for p in payloads]
    assert [item.output for n, item in enumerate(items) if n != 2] == alone


def test_a_batch_the_model_fails_is_split_to_the_guiltyimage(tmp_path: Path) -> None:
    """Bisecting collates the items again from their rows of the buffer: the others still get their own answers."""
    runner = imaging.runner(tmp_path)
    payloads = [imaging.image(n, fmt="PNG") for n in range(4)]
    items = imaging.items([*payloads[:3], imaging.image(9, fmt="PNG", white=True), payloads[3]], "image/png")
    run_batch(runner, items)
    assert [item.error is None for item in items] == [True, True, True, False, True]
    assert "a white image" in (items[3].error or "")
    alone = [runner.handler.run([(p, "image/png")])[0] for p in payloads]
    assert [item.output for n, item in enumerate(items) if n != 3] == alone


def test_only_the_built_in_preprocessing_is_written_in_place(tmp_path: Path) -> None:
    runner = imaging.runner(tmp_path, Sums)
    assert buffers.filler(runner.handler) is runner.handler
    own = imaging.runner(tmp_path / "own", OwnPreprocess)
    assert buffers.filler(own.handler) is None
    payloads = [imaging.image(n) for n in range(3)]
    prepared = prepare(own, imaging.items(payloads))
    expected = torch.stack([own.handler.preprocess(p, "image/jpeg") for p in payloads])
    assert torch.equal(prepared.groups[0][1], expected) and prepared.leases == []
