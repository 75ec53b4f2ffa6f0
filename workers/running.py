"""Running one batch through a model: per-item preprocessing, collate, one forward pass, per-item output.

No Redis here: ``workers.batching`` loads the batch and stores what this module produced.
"""

from __future__ import annotations

import json
import logging
import math
import time
import traceback
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from inferq.shared.errors import AppError, ConfigError, InvalidInput
from inferq.shared.lifecycle.claims import Claimed
from inferq.shared.models import ModelConfig, weights_sha256
from inferq.workers import buffers, fusion
from inferq.workers.collation import CountMismatch, record_stream, signature
from inferq.workers.cpu_threads import ThreadTuner
from inferq.workers.feeders import Feeders
from inferq.workers.handlers import Handler, load_handler
from inferq.workers.text import tokenizes_many

log = logging.getLogger(__name__)
# Weight formats stored as a traced graph, whose shapes (the batch axis among them) may have been fixed when saved.
_GRAPH_FORMATS = ("export", "onnx", "torchscript")


class BatchTimeout(BaseException):
    """The batch ran past its jobs' timeout. A BaseException, so the per-item isolation does not swallow it."""


@dataclass
class ModelRunner:
    """A loaded model and how to batch it."""

    config: ModelConfig
    handler: Handler
    device: torch.device
    # The batch ceiling: 1 for a model that cannot batch (found at load), lowered (and logged) when a batch
    # runs out of memory, so it is not hit again.
    max_batch: int
    warned_shapes: bool = False
    weights_sha256: str | None = None  # what a job's view names as the weights that answered it
    # Its model has other versions: each batch's outcomes are judged for a rollback (shared/versions.py).
    judged: bool = False
    # The worker's intra-op thread count (workers/cpu_threads.py), told of each forward; None: torch's default.
    tuner: ThreadTuner | None = None
    # The model runs channels-last (an image model whose forwards were faster so: ``choose_layout``).
    channels_last: bool = False
    # What ``choose_layout`` kept rewritten in the model's graph (workers.fusion; "" when it runs as loaded).
    fused: str = ""
    # A sequence model's forward time against its padded positions, which the plan's cuts weigh (``partition``).
    forward_cost: ForwardCost = field(default_factory=lambda: ForwardCost())
    # The batch tensors a built-in image handler's batches are written into, reused (workers.buffers).
    buffers: buffers.BatchBuffers = field(default_factory=lambda: buffers.BatchBuffers())
    # The processes that decode its images into shared buffers (workers.feeders); None: this process does.
    feeders: Feeders | None = None


@dataclass
class Item:
    """One job of a batch and what happened to it."""

    job: Claimed
    payload: bytes | None
    content_type: str
    # What the run adds to the job's info hash (its inference time); the hash's own fields are on ``job.info``.
    info: dict[str, str] = field(default_factory=dict)
    # An item of a bulk chunk (``job`` is the chunk): the client's id for it.
    custom_id: str | None = None
    trace: dict[str, str] | None = None  # a bulk item's own W3C trace context, when its line gave one
    value: Any = None
    output: Any = None
    output_json: str | None = None  # the output as JSON, checked encodable once and stored as it is
    error: str | None = None
    traceback: str | None = None
    # It failed for its input, not for the model (the handler refused it as the client's: ``InvalidInput``; or it
    # expired): a version's rollback never counts it (shared/versions.py ``judge``).
    input_refused: bool = False

    def fail(
        self,
        reason: str,
        exc: BaseException | None = None,
        *,
        input_refused: bool = False,
        told_traceback: str | None = None,
    ) -> None:
        """Fail the item; ``told_traceback``: the traceback of an error raised elsewhere (a feeder's)."""
        self.error = reason
        self.traceback = "".join(traceback.format_exception(exc)) if exc is not None else told_traceback or reason
        self.input_refused = input_refused or isinstance(exc, InvalidInput)


@dataclass
class BatchReport:
    """What running one popped batch took: the worker logs it (and metrics read it)."""

    inference_ms: float = 0.0
    collates: int = 0
    forwards: int = 0
    tokens: int = 0
    padded_tokens: int = 0
    # (phase, start, end) in epoch nanoseconds: what a batch's trace shows as its phases' spans.
    phases: list[tuple[str, int, int]] = field(default_factory=list)

    @property
    def padding_waste(self) -> float:
        """The share of the padded token grid that was padding (0 when nothing was padded)."""
        return 1.0 - self.tokens / self.padded_tokens if self.padded_tokens else 0.0


def readable(exc: BaseException) -> str:
    """A short reason a client can read."""
    if isinstance(exc, AppError):
        return exc.message
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


def is_out_of_memory(exc: BaseException) -> bool:
    """CUDA's own error, a host MemoryError, or any error whose message says so (other backends, ONNX)."""
    return isinstance(exc, torch.cuda.OutOfMemoryError | MemoryError) or "out of memory" in str(exc).lower()


@dataclass
class Prepared:
    """A batch ready for the model: items preprocessed, planned into groups, each group collated.

    ``groups`` holds (items, collated batch, None) or (items, None, the collate error). Preparing is
    what the worker overlaps with the previous batch's forward pass (``INFERQ_OVERLAP``); running a
    Prepared gives exactly what ``run_batch`` gives.
    """

    items: list[Item]
    groups: list[tuple[list[Item], Any, Exception | None]] = field(default_factory=list)
    prepare_ms: float = 0.0
    phases: list[tuple[str, int, int]] = field(default_factory=list)  # preprocess and collate (BatchReport.phases)
    # The CUDA stream its copies to the device were queued on, when prepared off the main thread.
    stream: Any = None
    # The reused buffers its batches were written into (workers.buffers), given back once it ran.
    leases: list[buffers.Lease] = field(default_factory=list)

    def give_back(self) -> None:
        for lease in self.leases:
            lease.give_back()


def prepare(runner: ModelRunner, items: list[Item]) -> Prepared:
    """Preprocess each item (a bad one fails alone), plan the groups and collate them (onto the device)."""
    started, began = time.perf_counter(), time.time_ns()
    # A built-in image handler's batch is written in place, each image normalised into it (workers.buffers).
    image = buffers.filler(runner.handler)
    filling = buffers.Filling(image, runner) if image is not None else None
    # A built-in text handler's texts are tokenised in one call (workers/text.py ``preprocess_many``).
    texts = tokenizes_many(runner.handler)
    tokenised: list[Item] = []
    for item in items:
        if item.payload is None:
            item.fail("the job's input expired before it ran", input_refused=True)
            continue
        try:
            if filling is not None:
                filling.add(item, item.payload)
            elif texts is not None:
                tokenised.append(item)
            else:
                item.value = runner.handler.preprocess(item.payload, item.content_type)
        except Exception as exc:  # one bad item fails only its own job
            item.fail(readable(exc), exc)
    if texts is not None and tokenised:
        values = texts.preprocess_many([(item.payload or b"", item.content_type) for item in tokenised])
        for item, value in zip(tokenised, values, strict=True):
            if isinstance(value, Exception):
                item.fail(readable(value), value)
            else:
                item.value = value
    prepared = Prepared(items, leases=filling.leases if filling is not None else [])
    preprocessed = time.time_ns()
    # Each group and what its batch is made of: its rows of a buffer, moved to the device; or its items, collated.
    if filling is not None:
        groups: list[tuple[list[Item], Any]] = list(filling.groups())
        collate: Callable[[Any], Any] = filling.to_device
    else:
        good = plan(runner, [item for item in items if item.error is None])
        groups, collate = [(group, [item.value for item in group]) for group in good], runner.handler.collate
    for group, parts in groups:
        try:
            prepared.groups.append((group, laid_out(runner, collate(parts)), None))
        except Exception as exc:
            prepared.groups.append((group, None, exc))
    prepared.phases += [("preprocess", began, preprocessed), ("collate", preprocessed, time.time_ns())]
    prepared.prepare_ms = (time.perf_counter() - started) * 1000.0
    return prepared


def run_prepared(runner: ModelRunner, prepared: Prepared) -> BatchReport:
    """Fill each item's output or error: the forward passes of a prepared batch."""
    try:
        return _run_prepared(runner, prepared)
    finally:
        prepared.give_back()  # its outputs are on the CPU: the batch's buffers are free for the next one


def _run_prepared(runner: ModelRunner, prepared: Prepared) -> BatchReport:
    started = time.perf_counter()
    report = BatchReport(phases=list(prepared.phases))
    if prepared.stream is not None:
        # The copies were queued on another stream: the model's stream waits for them, and their memory
        # is not reused before the model's stream is done with it.
        current = torch.cuda.current_stream(prepared.stream.device)
        current.wait_stream(prepared.stream)
        for _, batch, _ in prepared.groups:
            record_stream(batch, current)
    for group, batch, collate_error in prepared.groups:
        report.collates += 1
        if collate_error is not None:
            _collate_apart(runner, group, collate_error, report)
            continue
        _forward(runner, group, batch, report, _count_tokens(runner, group, report))
    report.inference_ms = prepared.prepare_ms + (time.perf_counter() - started) * 1000.0
    return report


def run_batch(runner: ModelRunner, items: list[Item]) -> BatchReport:
    """Fill each item's output or error."""
    return run_prepared(runner, prepare(runner, items))


def plan(runner: ModelRunner, items: list[Item]) -> list[list[Item]]:
    """Sub-batches within the ceiling; with ``max_batch_tokens``, of similar lengths within the token budget, cut
    where the padding they save is worth more than another forward (``partition``)."""
    if not items:
        return []
    budget = runner.config.max_batch_tokens
    lengths = [runner.handler.item_length(item.value) for item in items] if budget else []
    if not budget or any(length is None for length in lengths):
        return [items[i : i + runner.max_batch] for i in range(0, len(items), runner.max_batch)]
    pairs = sorted(zip(lengths, items, strict=True), key=lambda pair: pair[0] or 0)
    ordered = [length or 0 for length, _ in pairs]
    cuts = partition(ordered, runner.max_batch, budget, runner.forward_cost.overhead_positions())
    return [[item for _, item in pairs[start:end]] for start, end in cuts]


def partition(lengths: list[int], max_batch: int, budget: int, overhead: float) -> list[tuple[int, int]]:
    """Cut ascending ``lengths`` into runs, each at most ``max_batch`` long and ``budget`` padded positions (a run of
    one may exceed it), minimising the padded positions run plus ``overhead`` positions per forward: the fewest
    forwards when a forward's fixed cost is large, the least padding when it is small. Dynamic programming over
    the cut points (at most ``len(lengths) * max_batch`` steps)."""
    n = len(lengths)
    best = [0.0] + [math.inf] * n
    start_of = [0] * (n + 1)
    for end in range(1, n + 1):
        longest = lengths[end - 1]  # ascending: a run's last length is its longest
        for start in range(end - 1, max(-1, end - 1 - max_batch), -1):
            size = end - start
            if size > 1 and size * longest > budget:
                break
            cost = best[start] + overhead + size * longest
            if cost < best[end]:
                best[end], start_of[end] = cost, start
    cuts = []
    end = n
    while end > 0:
        cuts.append((start_of[end], end))
        end = start_of[end]
    return cuts[::-1]


class ForwardCost:
    """A sequence model's forward time as ``a + b * padded positions``, fitted by least squares over its recent
    forwards; ``a / b``, the fixed cost of a forward in positions, is what ``partition`` weighs a cut against."""

    def __init__(self, default_positions: float = 64.0, decay: float = 0.98, min_samples: int = 20) -> None:
        self.default = default_positions
        self.decay = decay
        self.min_samples = min_samples
        self.samples = 0
        self.n = self.sx = self.sy = self.sxx = self.sxy = 0.0

    def observe(self, positions: int, seconds: float) -> None:
        d = self.decay
        self.n = self.n * d + 1
        self.sx = self.sx * d + positions
        self.sy = self.sy * d + seconds
        self.sxx = self.sxx * d + positions * positions
        self.sxy = self.sxy * d + positions * seconds
        self.samples += 1

    def overhead_positions(self) -> float:
        if self.samples < self.min_samples:
            return self.default
        spread = self.n * self.sxx - self.sx * self.sx
        if spread <= 0:
            return self.default
        slope = (self.n * self.sxy - self.sx * self.sy) / spread
        intercept = (self.sy - slope * self.sx) / self.n
        if slope <= 0:
            return self.default
        return min(max(intercept / slope, 0.0), 1e6)


def _run_group(runner: ModelRunner, items: list[Item], report: BatchReport, isolate: bool = True) -> None:
    handler = runner.handler
    report.collates += 1
    began = time.time_ns()
    try:
        batch = laid_out(runner, handler.collate([item.value for item in items]))
    except Exception as exc:
        if not isolate:
            for item in items:
                item.fail(f"could not batch this input: {readable(exc)}", exc)
            return
        _collate_apart(runner, items, exc, report)
        return
    report.phases.append(("collate", began, time.time_ns()))
    _forward(runner, items, batch, report, _count_tokens(runner, items, report))


def _count_tokens(runner: ModelRunner, items: list[Item], report: BatchReport) -> int | None:
    """Add the group's tokens and padded grid to the report; the grid's positions (None: not a sequence model)."""
    lengths = [runner.handler.item_length(item.value) for item in items]
    if not all(length is not None for length in lengths):
        return None
    positions = len(items) * max(length or 0 for length in lengths)
    report.tokens += sum(length or 0 for length in lengths)
    report.padded_tokens += positions
    return positions


def _collate_apart(runner: ModelRunner, items: list[Item], exc: Exception, report: BatchReport) -> None:
    """A batch that does not collate: fail what cannot be batched even alone, run the rest by shape."""
    good = []
    for item in items:
        try:
            runner.handler.collate([item.value])
        except Exception as alone:
            log.info("job %s: input cannot be batched (%s)", item.job.id, alone)
            item.fail(f"could not batch this input: {readable(alone)}", alone)
        else:
            good.append(item)
    groups: dict[Any, list[Item]] = defaultdict(list)
    for item in good:
        groups[signature(item.value)].append(item)
    if len(groups) > 1 and not runner.warned_shapes:
        runner.warned_shapes = True
        log.warning(
            "model %s: its handler's collate cannot batch items of different shapes (%s); running them in groups "
            "of one shape. Pad them in collate (inferq.workers.handlers.pad_sequences) to batch them together.",
            runner.config.name,
            readable(exc),
        )
    for group in groups.values():
        _run_group(runner, group, report, isolate=False)


def _forward(runner: ModelRunner, items: list[Item], batch: Any, report: BatchReport, positions: int | None) -> None:
    """One forward pass; out of memory halves the batch, any other failure bisects to the guilty item.
    ``positions``: a sequence model's padded grid, which its forward time is fitted against (``ForwardCost``)."""
    handler = runner.handler
    report.forwards += 1
    tuner = runner.tuner
    if tuner is not None:
        tuner.before(runner.config.name)
    began = time.time_ns()
    try:
        with torch.inference_mode():
            outputs = handler.predict(batch)
    except Exception as exc:
        del batch
        half = len(items) // 2
        if is_out_of_memory(exc):
            if runner.device.type == "cuda":
                torch.cuda.empty_cache()
            if len(items) == 1:
                log.error("model %s: out of memory on a batch of one (job %s)", runner.config.name, items[0].job.id)
                items[0].fail(f"the model ran out of memory on this input alone: {readable(exc)}", exc)
                return
            if half < runner.max_batch:
                runner.max_batch = half
                log.warning(
                    "model %s: out of memory at batch %d; batch ceiling lowered to %d",
                    runner.config.name,
                    len(items),
                    half,
                )
        elif len(items) == 1:
            log.exception("model failed on job %s", items[0].job.id)
            items[0].fail(f"model failed on this input: {readable(exc)}", exc)
            return
        else:
            log.warning("batch of %d failed (%s); splitting to isolate the bad item", len(items), exc)
        _run_group(runner, items[:half], report)
        _run_group(runner, items[half:], report)
        return
    predicted = time.time_ns()
    if tuner is not None:
        tuner.observe(runner.config.name, (predicted - began) / 1e9, len(items))
    if positions is not None and runner.config.max_batch_tokens:
        runner.forward_cost.observe(positions, (predicted - began) / 1e9)
    try:
        per_item = handler.uncollate(outputs, len(items))
        if len(per_item) != len(items):
            raise CountMismatch(f"uncollate returned {len(per_item)} outputs for {len(items)} inputs")
    except Exception as exc:  # a handler bug: no single item is to blame, so the batch fails as one
        log.error("model %s: uncollate failed for a batch of %d: %s", runner.config.name, len(items), exc)
        for item in items:
            item.fail(f"the model's outputs could not be matched to its inputs: {readable(exc)}", exc)
        return
    uncollated = time.time_ns()
    for item, output in zip(items, per_item, strict=True):
        try:
            result = handler.postprocess(output)
            item.output_json = json.dumps(result, allow_nan=False)  # the result must be storable as strict JSON
            item.output = result
        except Exception as exc:
            item.fail(f"could not encode the output: {readable(exc)}", exc)
    report.phases += [
        ("predict", began, predicted),
        ("uncollate", predicted, uncollated),
        ("postprocess", uncollated, time.time_ns()),
    ]


def load_runner(
    config: ModelConfig,
    device: torch.device,
    max_batch: int,
    on_warm_up: Callable[[], None] | None = None,
    **handler_options: Any,
) -> ModelRunner:
    """Build the handler, load its weights and warm it up (``on_warm_up`` is told first); any failure is one
    ConfigError naming the model."""
    handler = load_handler(config, device, **handler_options)
    try:
        handler.load()
    except ConfigError:
        raise
    except Exception as exc:  # a user's load() can fail in any way
        raise ConfigError(f"model {config.name!r}: loading {config.weights_path} failed: {readable(exc)}") from exc
    try:  # a user's handler may build its model without a weights file: it has no hash then
        digest = weights_sha256(config) if config.weights_path.exists() else None
    except OSError as exc:
        raise ConfigError(f"model {config.name!r}: reading {config.weights_path} failed: {exc}") from exc
    runner = ModelRunner(config, handler, device, max(1, max_batch), weights_sha256=digest)
    check_batch_axis(runner)
    if config.warmup or config.compile:
        if on_warm_up is not None:
            on_warm_up()
        warm_up(runner)
    choose_layout(runner)
    return runner


LAYOUT_MARGIN = 0.05  # a layout or graph other than the loaded one is kept only when its forwards are this much faster
TIMED_ROUNDS = 3  # alternated rounds of the candidates' forwards; each one's best counts


@dataclass
class _Candidate:
    """One way to run the model: its module (as loaded or rewritten) in one memory layout."""

    module: torch.nn.Module
    channels_last: bool
    fused: str = ""  # what was rewritten (workers.fusion), "" as loaded

    def describe(self) -> str:
        return form_name(self.channels_last, self.fused)


def form_name(channels_last: bool, fused: str) -> str:
    """How a model runs, as logs and the benchmark name it: its layout, and whether its graph is fused."""
    return ("channels-last" if channels_last else "contiguous") + (", fused" if fused else "")


def choose_layout(runner: ModelRunner) -> None:
    """The model in its fastest form on this machine: memory layout, and (an exported graph) fused or as loaded.

    - Layout, an image model (a batch that is one 4-D float tensor, an ``nn.Module``): oneDNN's CPU convolutions
      run channels-last without the reorders a contiguous (NCHW) tensor costs: a ResNet-18-sized model's batch of 8
      ran 82 against 100 ms on 2 cores. ``memory_format``: ``auto`` tries both on the CPU (on a GPU it leaves the
      layout alone), ``channels_last`` forces it, ``contiguous`` keeps the layout as loaded.
    - Fusion, a ``torch.export`` module on the CPU: batch norms folded into their convolutions, convolutions run
      with their ReLU as one oneDNN call, their weights prepacked (``workers.fusion``; the same CNN at batch 8,
      channels-last: 155 -> 134 ms fused; at batch 1, 21 -> 14 ms prepacked).
      The rewrite is exact up to float rounding and checked: its outputs on a batch at the ceiling must match the
      loaded graph's, or it is dropped. ``fuse``: ``auto`` tries it (float32 models), ``on`` keeps it whenever it
      checks out, ``off`` leaves the graph alone.

    With more than one candidate, each runs a batch at the ceiling in ``TIMED_ROUNDS`` alternated rounds (after one
    to warm each; the best counts, so a burst of someone else's work lands on one round, not on one candidate), and
    the fastest is kept when it is ``LAYOUT_MARGIN`` faster than the model as loaded.
    """
    config, handler = runner.config, runner.handler
    model = getattr(handler, "model", None)
    if not isinstance(model, torch.nn.Module):
        return
    example = handler.warmup_payload()
    if example is None:
        return
    try:
        with torch.inference_mode():
            batch = handler.collate([handler.preprocess(*example)] * runner.max_batch)
    except Exception as exc:  # its jobs will say why
        log.info("model %s: runs as loaded (its example batch failed: %s)", config.name, readable(exc))
        return
    image = isinstance(batch, torch.Tensor) and batch.dim() == 4 and batch.is_floating_point()
    layouts = [False]
    if image and config.memory_format == "channels_last":
        layouts = [True]
    elif image and config.memory_format == "auto" and runner.device.type == "cpu":
        layouts = [False, True]
    candidates = [_Candidate(model, channels_last) for channels_last in layouts]
    rewritten = _fused(runner, model, batch)
    if rewritten is not None:
        fused_ones = [_Candidate(rewritten.module, c, rewritten.describe()) for c in layouts]
        candidates = fused_ones if config.fuse == "on" else [*candidates, *fused_ones]
    try:
        chosen, timings = _fastest(handler, candidates, batch)
    except Exception as exc:  # a model that cannot run channels-last keeps its layout
        log.info("model %s: runs as loaded (a candidate form failed: %s)", config.name, readable(exc))
        chosen, timings = candidates[0], []
        if rewritten is not None and config.fuse == "on":
            chosen = _Candidate(rewritten.module, False, rewritten.describe())
    _lay_out(chosen.module, torch.channels_last if chosen.channels_last else torch.contiguous_format)
    handler.model = chosen.module
    runner.channels_last, runner.fused = chosen.channels_last, chosen.fused
    if chosen.fused:
        log.info("model %s: %s", config.name, chosen.fused)
    if timings:
        shown = ", ".join(f"{c.describe()} {ms:.1f} ms" for c, ms in timings)
        log.info("model %s runs %s (batch %d: %s)", config.name, chosen.describe(), runner.max_batch, shown)
    elif chosen.channels_last or chosen.fused:
        log.info("model %s runs %s", config.name, chosen.describe())


def laid_out(runner: ModelRunner, batch: Any) -> Any:
    """The collated batch in the model's layout: channels-last for a model that runs so."""
    if runner.channels_last and isinstance(batch, torch.Tensor) and batch.dim() == 4:
        return batch.contiguous(memory_format=torch.channels_last)
    return batch


def _lay_out(model: torch.nn.Module, layout: torch.memory_format) -> None:
    """Convert a module's 4-D weights (Module.to takes ``memory_format``; its type hints leave it out)."""
    model.to(memory_format=layout)  # type: ignore[call-overload]


def _fused(runner: ModelRunner, model: torch.nn.Module, batch: Any) -> fusion.Fused | None:
    """The model's graph rewritten by ``workers.fusion``, when its config and device allow it and its outputs on
    ``batch`` match the loaded graph's; else None."""
    config, handler = runner.config, runner.handler
    if config.fuse == "off" or runner.device.type != "cpu" or not isinstance(model, torch.fx.GraphModule):
        return None
    if config.fuse == "auto" and config.dtype != "float32":
        return None
    try:
        with torch.inference_mode():
            rewritten = fusion.fused(model)
            if rewritten is None:
                return None
            expected = handler.predict(batch)
            handler.model = rewritten.module
            torch.testing.assert_close(handler.predict(batch), expected, rtol=1e-3, atol=1e-3)
    except Exception as exc:  # a graph the rewrite cannot run, or whose outputs moved
        log.warning(
            "model %s: its graph stays as loaded (the fused one failed its check: %s)", config.name, readable(exc)
        )
        return None
    finally:
        handler.model = model
    return rewritten


def _fastest(
    handler: Handler, candidates: list[_Candidate], batch: torch.Tensor
) -> tuple[_Candidate, list[tuple[_Candidate, float]]]:
    """The candidate to keep, and each one's best forward in ms; untimed when there is one."""
    if len(candidates) == 1:
        return candidates[0], []
    best = {id(c): math.inf for c in candidates}
    with torch.inference_mode():
        for attempt in range(TIMED_ROUNDS + 1):  # the first round warms each candidate
            for candidate in candidates:
                layout = torch.channels_last if candidate.channels_last else torch.contiguous_format
                _lay_out(candidate.module, layout)
                handler.model = candidate.module
                laid = batch.contiguous(memory_format=layout) if candidate.channels_last else batch
                began = time.perf_counter()
                handler.predict(laid)
                if attempt:
                    best[id(candidate)] = min(best[id(candidate)], time.perf_counter() - began)
    timings = [(c, best[id(c)] * 1000) for c in candidates]
    loaded = candidates[0]
    fastest = min(candidates, key=lambda c: best[id(c)])
    if best[id(fastest)] > best[id(loaded)] * (1 - LAYOUT_MARGIN):
        return loaded, timings
    return fastest, timings


def check_batch_axis(runner: ModelRunner) -> None:
    """A saved graph whose batch axis was fixed at 1 runs at batch 1: its failing batches are not the data's fault."""
    config, handler = runner.config, runner.handler
    # Only a saved graph (export, ONNX, TorchScript) can have frozen its batch axis, and a handler that loads
    # no weights through its config (its own load()) has no such graph: it is never run here.
    if runner.max_batch < 2 or config.format not in _GRAPH_FORMATS or handler.model is None:
        return
    example = handler.warmup_payload()
    if example is None:
        return
    try:
        handler.run([example] * 2)
        return
    except Exception as exc:
        at_two = exc
    try:
        handler.run([example])
    except Exception:  # it fails alone too: its jobs will say why; nothing here is about batching
        return
    log.warning(
        "model %r takes one item at a time: a batch of 2 fails (%s) where one item runs, so it is served at batch 1, "
        "not %d. Its batch axis was fixed when it was exported; to batch, export it with a dynamic one: "
        'torch.export.export(model, args, dynamic_shapes=({0: torch.export.Dim("batch")},)), '
        "which inferq.workers.formats.save_export does",
        config.name,
        readable(at_two),
        runner.max_batch,
    )
    runner.max_batch = 1


def warm_up(runner: ModelRunner) -> None:
    """Run batches of one and of the ceiling (and two, for torch.compile's dynamic shapes) before taking jobs."""
    config, handler = runner.config, runner.handler
    example = handler.warmup_payload()
    if example is None:
        raise ConfigError(
            f"model {config.name!r}: warm-up needs an example input; handler {config.handler} has no warmup_payload()"
        )
    sizes = sorted({1, min(2, runner.max_batch), runner.max_batch} if config.compile else {1, runner.max_batch})
    started = time.perf_counter()
    for size in sizes:
        try:
            handler.run([example] * size)
        except Exception as exc:
            raise ConfigError(
                f"model {config.name!r}: warm-up with {config.weights_path} failed at batch {size}: {readable(exc)}"
            ) from exc
    log.info("model %s warmed up (batches %s) in %.1f s", config.name, sizes, time.perf_counter() - started)
