"""The runner: collate, isolation, out-of-memory halving, token budgets and ragged outputs; no Redis."""

from __future__ import annotations

import json
import logging
import random
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest
import torch

from inferq.shared.errors import InvalidInput
from inferq.shared.models import load_model_config
from inferq.workers.collation import pad_sequences, split, stack
from inferq.workers.handlers import Handler
from inferq.workers.running import ForwardCost, Item, ModelRunner, load_runner, partition, prepare, run_batch
from inferq.workers.text import TextClassifier, tokenizes_many
from tests.support.builders import (
    Ragged,
    cnn_in_every_format,
    gray_png,
    sentences,
    small_cnn_probs,
    write_bert,
    write_config,
    write_fixed_batch_cnn,
)

CPU = torch.device("cpu")
TENSOR_4 = {"kind": "tensor", "shape": [4], "dtype": "float32"}


def _items(payloads: list[bytes], content_type: str = "application/json") -> list[Item]:
    return [
        Item(cast(Any, SimpleNamespace(id=f"job-{i}")), payload, content_type) for i, payload in enumerate(payloads)
    ]


def _runner(tmp_path: Path, handler: str, max_batch: int = 64, **config: Any) -> ModelRunner:
    folder = write_config(tmp_path / "m", handler=handler, weights="none", max_batch=max_batch, **config)
    return load_runner(load_model_config(folder), CPU, max_batch)


class Counting(Handler):
    """Default collate (stack) on variable-length items: the case that used to run at batch size 1."""

    def load(self) -> None:
        self.collates = self.forwards = 0
        self.model = lambda batch: batch.sum(dim=-1, keepdim=True)

    def preprocess(self, payload: bytes, content_type: str) -> torch.Tensor:
        return torch.tensor(json.loads(payload)["inputs"], dtype=torch.float32)

    def collate(self, items: list[Any]) -> Any:
        self.collates += 1
        if any(bool((item < 0).any()) for item in items):
            raise InvalidInput("negative values cannot be batched")  # collates with nothing, not even alone
        return super().collate(items)

    def predict(self, batch: Any) -> Any:
        self.forwards += 1
        return super().predict(batch)


class Padding(Counting):
    def collate(self, items: list[Any]) -> Any:
        self.collates += 1
        return pad_sequences(items)


class OutOfMemoryAbove(Counting):
    """Raises what CUDA raises when the batch is over 3 items."""

    def predict(self, batch: Any) -> Any:
        self.forwards += 1
        if len(batch) > 3:
            raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return self.model(batch)


class WrongCount(Counting):
    def uncollate(self, outputs: Any, n: int) -> list[Any]:
        return list(outputs)[:-1]


def _payloads(rows: list[list[Any]]) -> list[bytes]:
    return [json.dumps({"inputs": row}).encode() for row in rows]


def test_a_padding_handler_runs_variable_lengths_as_one_batch(tmp_path: Path) -> None:
    runner = _runner(tmp_path, "tests.unit.test_running:Padding", input=TENSOR_4)
    items = _items(_payloads([[1.0] * n for n in range(1, 9)]))
    run_batch(runner, items)
    handler = cast(Padding, runner.handler)
    assert (handler.collates, handler.forwards) == (1, 1)
    assert [item.output for item in items] == [{"output": [float(n)]} for n in range(1, 9)]


def test_items_of_different_shapes_run_by_shape_not_one_by_one(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    runner = _runner(tmp_path, "tests.unit.test_running:Counting", input=TENSOR_4)
    lengths = [2, 3, 2, 3, 2, 3, 2, 3]
    items = _items(_payloads([[1.0] * n for n in lengths]))
    with caplog.at_level(logging.WARNING):
        run_batch(runner, items)
    handler = cast(Counting, runner.handler)
    # One failed collate, eight single-item checks, then one batch per shape: two forward passes, not eight.
    assert handler.forwards == 2
    assert [item.output for item in items] == [{"output": [float(n)]} for n in lengths]
    assert "cannot batch items of different shapes" in caplog.text
    assert runner.warned_shapes


def test_an_item_that_cannot_be_collated_fails_alone(tmp_path: Path) -> None:
    runner = _runner(tmp_path, "tests.unit.test_running:Counting", input=TENSOR_4)
    items = _items(_payloads([[1.0, 2.0], [-1.0, 2.0], [3.0, 4.0], [5.0, 6.0]]))
    run_batch(runner, items)
    assert items[1].error == "could not batch this input: negative values cannot be batched"
    assert [items[i].output for i in (0, 2, 3)] == [{"output": [3.0]}, {"output": [7.0]}, {"output": [11.0]}]
    assert cast(Counting, runner.handler).forwards == 1


def test_out_of_memory_halves_the_batch_and_lowers_the_ceiling(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    runner = _runner(tmp_path, "tests.unit.test_running:OutOfMemoryAbove", max_batch=16, input=TENSOR_4)
    items = _items(_payloads([[float(i)] for i in range(12)]))
    with caplog.at_level(logging.WARNING):
        run_batch(runner, items)
    assert [item.error for item in items] == [None] * 12
    assert [item.output for item in items] == [{"output": [float(i)]} for i in range(12)]
    assert runner.max_batch == 3  # 12 -> 6 -> 3: remembered, so later pops take at most 3
    assert "out of memory at batch 12; batch ceiling lowered to 6" in caplog.text
    assert "out of memory at batch 6; batch ceiling lowered to 3" in caplog.text
    handler = cast(OutOfMemoryAbove, runner.handler)
    forwards_before = handler.forwards
    more = _items(_payloads([[1.0]] * 7))
    run_batch(runner, more)
    assert handler.forwards - forwards_before == 3  # 3 + 3 + 1 within the ceiling, no failing pass
    assert all(item.error is None for item in more)


def test_a_model_exported_for_batches_of_one_runs_them_without_blaming_the_data(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """It used to fail every batch, bisect it ("splitting to isolate the bad item") and run each item alone."""
    folder = write_fixed_batch_cnn(tmp_path / "fixed")
    with caplog.at_level(logging.INFO, logger="workers"):
        runner = load_runner(load_model_config(folder), CPU, 8)
        items = _items([gray_png(seed) for seed in range(5)], "image/png")
        report = run_batch(runner, items)
    assert runner.max_batch == 1
    assert report.forwards == 5  # one pass per item, none failing
    assert [item.error for item in items] == [None] * 5
    assert [item.output for item in items] == [
        runner.handler.run([(gray_png(seed), "image/png")])[0] for seed in range(5)
    ]
    warnings = [record.getMessage() for record in caplog.records if record.levelno >= logging.WARNING]
    assert warnings == [
        "model 'fixed' takes one item at a time: a batch of 2 fails (AssertionError: Guard failed: x.size()[0] == 1) "
        "where one item runs, so it is served at batch 1, not 8. Its batch axis was fixed when it was exported; "
        "to batch, export it with a dynamic one: torch.export.export(model, args, "
        'dynamic_shapes=({0: torch.export.Dim("batch")},)), which inferq.workers.formats.save_export does'
    ]


def test_an_uncollate_count_mismatch_fails_the_batch_readably(tmp_path: Path) -> None:
    runner = _runner(tmp_path, "tests.unit.test_running:WrongCount", input=TENSOR_4)
    items = _items(_payloads([[1.0, 2.0]] * 4))
    run_batch(runner, items)
    assert cast(WrongCount, runner.handler).forwards == 1  # no bisecting a handler bug
    assert {item.error for item in items} == {
        "the model's outputs could not be matched to its inputs: "
        "CountMismatch: uncollate returned 3 outputs for 4 inputs"
    }


def test_ragged_outputs_differ_in_size_per_item(tmp_path: Path) -> None:
    runner = _runner(tmp_path, "tests.support.builders:Ragged", input={"kind": "json"})
    Ragged.calls.update(collate=0, predict=0)
    rows = [[0.1, 0.9, 0.7], [0.2], [0.6, 0.6, 0.6, 0.6, 0.1]]
    items = _items([json.dumps({"values": row}).encode() for row in rows])
    run_batch(runner, items)
    assert [item.output for item in items] == [
        {"kept": [pytest.approx(1.8), pytest.approx(1.4)], "count": 2},
        {"kept": [], "count": 0},
        {"kept": [pytest.approx(1.2)] * 4, "count": 4},
    ]
    assert Ragged.calls == {"collate": 1, "predict": 1}


def test_default_stack_and_split_handle_dicts_and_lists() -> None:
    items = [{"a": torch.ones(2), "b": torch.zeros(3)}, {"a": torch.zeros(2), "b": torch.ones(3)}]
    batch = stack(items)
    assert batch["a"].shape == (2, 2) and batch["b"].shape == (2, 3)
    back = split(batch, 2)
    assert torch.equal(back[1]["b"], torch.ones(3))
    assert stack(["x", "y"]) == ["x", "y"]
    assert split([torch.ones(1), torch.ones(5)], 2)[1].shape == (5,)
    assert split(torch.ones(4, 2, dtype=torch.bfloat16), 4)[0].dtype == torch.float32
    padded = pad_sequences(
        [{"ids": torch.tensor([5, 6, 7]), "mask": torch.ones(3)}, {"ids": torch.tensor([5]), "mask": torch.ones(1)}],
        {"ids": 9},
    )
    assert padded["ids"].tolist() == [[5, 6, 7], [5, 9, 9]]
    assert padded["mask"].tolist() == [[1, 1, 1], [1, 0, 0]]


@pytest.fixture(scope="module")
def bert_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("bert")
    write_bert(folder / "hf")
    return folder


def _text_runner(root: Path, tmp_path: Path, **extra: Any) -> ModelRunner:
    folder = tmp_path / "text"
    folder.mkdir(parents=True)
    (folder / "hf").symlink_to(root / "hf")
    write_config(folder, handler="text_classifier", format="huggingface", weights="hf", input={"kind": "text"}, **extra)
    config = load_model_config(folder)
    return load_runner(config, CPU, config.max_batch)


def test_text_results_are_the_same_alone_and_in_a_padded_batch(bert_folder: Path, tmp_path: Path) -> None:
    runner = _text_runner(bert_folder, tmp_path, max_batch=64, top_k=2)
    texts = sentences(24, seed=3, max_words=30)
    alone = []
    for text in texts:
        (item,) = _items([text.encode()], "text/plain; charset=utf-8")
        run_batch(runner, [item])
        alone.append(item.output)
    batch = _items([t.encode() for t in texts], "text/plain; charset=utf-8")
    report = run_batch(runner, batch)
    assert report.forwards == 1 and report.padding_waste > 0.3  # lengths really differ
    for single, batched in zip(alone, batch, strict=True):
        assert batched.output["label"] == single["label"]
        for a, b in zip(single["top_k"], batched.output["top_k"], strict=True):
            assert a["label"] == b["label"] and abs(a["score"] - b["score"]) <= 1e-4


def test_max_batch_tokens_groups_similar_lengths(bert_folder: Path, tmp_path: Path) -> None:
    runner = _text_runner(bert_folder, tmp_path, max_batch=64, max_batch_tokens=256)
    texts = [*sentences(20, seed=5, min_words=1, max_words=3), *sentences(4, seed=6, min_words=35, max_words=40)]
    unbudgeted = _text_runner(bert_folder, tmp_path / "x", max_batch=64)
    plain = _items([t.encode() for t in texts], "text/plain")
    budgeted = _items([t.encode() for t in texts], "text/plain")
    plain_report = run_batch(unbudgeted, plain)
    report = run_batch(runner, budgeted)
    assert plain_report.forwards == 1 and report.forwards >= 2
    assert report.padded_tokens < plain_report.padded_tokens / 2  # short texts no longer pay for the long ones
    assert report.tokens == plain_report.tokens
    for a, b in zip(plain, budgeted, strict=True):
        assert a.output["label"] == b.output["label"]


def test_half_precision_gives_the_same_labels(bert_folder: Path, tmp_path: Path) -> None:
    texts = sentences(16, seed=8)
    labels = {}
    for dtype in ("float32", "bfloat16", "float16"):
        runner = _text_runner(bert_folder, tmp_path / dtype, dtype=dtype)
        assert next(runner.handler.model.parameters()).dtype == getattr(torch, dtype)
        items = _items([t.encode() for t in texts], "text/plain")
        run_batch(runner, items)
        assert all(item.error is None for item in items), [item.error for item in items]
        labels[dtype] = [item.output["label"] for item in items]
    # Random weights make near-ties; a label may flip only where float32's top two scores are within 2%.
    assert sum(a != b for a, b in zip(labels["float32"], labels["bfloat16"], strict=True)) <= 2
    assert labels["float16"] == labels["float32"]


def _cost(lengths: list[int], cuts: list[tuple[int, int]], overhead: float) -> float:
    return sum(overhead + (end - start) * lengths[end - 1] for start, end in cuts)


def _every_partition(n: int) -> list[list[tuple[int, int]]]:
    out = []
    for mask in range(2 ** (n - 1)):  # a cut after item i where bit i is set
        starts = [0] + [i + 1 for i in range(n - 1) if mask >> i & 1]
        out.append(list(zip(starts, [*starts[1:], n], strict=True)))
    return out


def test_partition_finds_the_cheapest_cuts_within_the_ceiling_and_the_budget() -> None:
    rng = random.Random(3)
    for _ in range(200):
        n = rng.randint(1, 8)
        lengths = sorted(rng.randint(1, 60) for _ in range(n))
        max_batch, budget, overhead = rng.randint(1, 8), rng.randint(40, 300), rng.choice([0.0, 10.0, 64.0, 500.0])
        allowed = [
            cuts
            for cuts in _every_partition(n)
            if all(e - s <= max_batch and (e - s == 1 or (e - s) * lengths[e - 1] <= budget) for s, e in cuts)
        ]
        cuts = partition(lengths, max_batch, budget, overhead)
        assert cuts in allowed
        assert _cost(lengths, cuts, overhead) == min(_cost(lengths, c, overhead) for c in allowed)


def test_partition_trades_forwards_against_padding() -> None:
    lengths = [3, 4, 5, 6, 40, 41, 42, 100]
    assert partition(lengths, 64, 4096, overhead=10_000) == [(0, 8)]  # a forward costs more than any padding
    assert partition(lengths, 64, 4096, overhead=64) == [(0, 4), (4, 7), (7, 8)]
    assert partition([3, 200], 64, 100, overhead=1e6) == [(0, 1), (1, 2)]  # over the budget together: apart


def test_forward_cost_learns_a_forwards_fixed_cost_in_positions() -> None:
    cost = ForwardCost(default_positions=64.0)
    assert cost.overhead_positions() == 64.0
    rng = random.Random(0)
    for _ in range(100):
        positions = rng.randint(8, 4096)
        cost.observe(positions, 0.0004 + positions * 3e-6)  # 0.4 ms a forward, 3 us a position
    assert cost.overhead_positions() == pytest.approx(0.0004 / 3e-6, rel=1e-6)


@pytest.mark.parametrize("layout", ["channels_last", "contiguous", "auto"])
@pytest.mark.parametrize("fmt", ["export", "safetensors", "torchscript"])
def test_an_image_model_answers_the_same_in_either_memory_layout(tmp_path: Path, fmt: str, layout: str) -> None:
    """channels_last is a layout, not a model: every format's answers stay those of the model as given."""
    folder = cnn_in_every_format(tmp_path)[fmt]
    config = json.loads((folder / "config.json").read_text())
    write_config(folder, **{**config, "memory_format": layout})
    runner = load_runner(load_model_config(folder), torch.device("cpu"), 8)
    if layout != "auto":  # auto keeps whichever its timing found faster: either is right
        assert runner.channels_last is (layout == "channels_last")
    images = [gray_png(seed) for seed in range(6)]
    items = _items(images, "image/png")
    run_batch(runner, items)
    for item, image in zip(items, images, strict=True):
        assert item.output["score"] == pytest.approx(max(small_cnn_probs(runner.handler, image).values()), abs=1e-5)


def test_a_text_model_is_never_laid_out_channels_last(bert_folder: Path, tmp_path: Path) -> None:
    runner = _text_runner(bert_folder, tmp_path, max_batch=8)
    assert not runner.channels_last


class _OwnTokens(TextClassifier):
    """A text handler with its own preprocess: the batch path leaves it alone."""

    def preprocess(self, payload: bytes, content_type: str) -> dict[str, torch.Tensor]:
        return super().preprocess(payload.upper(), content_type)


def test_a_batchs_texts_are_tokenised_in_one_call_to_what_each_alone_gives(bert_folder: Path, tmp_path: Path) -> None:
    """The tokenizer was called once per text (its per-call cost was most of a short text's preprocessing)."""
    runner = _text_runner(bert_folder, tmp_path, max_batch=64)
    handler = runner.handler
    assert tokenizes_many(handler) is handler
    texts = [*sentences(6, seed=5, max_words=30), "word " * 2000, "ünïcødé ☃ text", " "]
    payloads = [t.encode() for t in texts] + [b"\xff\xfe not utf-8"]
    calls: list[Any] = []
    tokenizer = handler.tokenizer  # type: ignore[attr-defined]
    handler.tokenizer = lambda *args, **kwargs: calls.append(args) or tokenizer(*args, **kwargs)  # type: ignore[attr-defined]
    items = _items(payloads, "text/plain; charset=utf-8")
    prepare(runner, items)
    assert len(calls) == 1  # one call for the batch's seven texts
    handler.tokenizer = tokenizer  # type: ignore[attr-defined]
    for item, payload in zip(items, payloads, strict=True):
        try:
            alone = handler.preprocess(payload, "text/plain; charset=utf-8")
        except InvalidInput as exc:
            assert item.error == exc.message and item.input_refused
            continue
        assert item.value.keys() == alone.keys()
        assert all(torch.equal(item.value[key], alone[key]) for key in alone)
    assert [item.error is None for item in items] == [True] * 8 + [False, False]
    assert len(items[6].value["input_ids"]) == handler.max_tokens  # truncated as alone  # type: ignore[attr-defined]
    own = _text_runner(bert_folder, tmp_path / "own", max_batch=64)
    own.handler.__class__ = _OwnTokens
    assert tokenizes_many(own.handler) is None
