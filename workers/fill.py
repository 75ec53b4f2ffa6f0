"""The fill wait: once a worker holds the jobs already waiting, how long it waits for more to join the batch.

Decisions and what they learn from, with no Redis and no clock of their own (the worker passes times in).

Three policies (``INFERQ_BATCH_WAIT``, ``INFERQ_MAX_WAIT_MS``):

- ``greedy``: never wait; run what waits now.
- fixed (``INFERQ_MAX_WAIT_MS`` above 0): wait up to that long from the first pop, for a full batch.
- ``adaptive`` (the default), learned per model from what the worker measures itself:

  * the model's batch-time curve, ``T(b) = fixed + per_item * b``, a least-squares line through the time each batch
    size took (start, decode, forward): each size's median of its last ``SAMPLES`` batches, so one slow batch (the
    first of a size compiling its kernels, a pause of the host) moves nothing. ``fixed`` is what a job that misses
    this batch costs: the next batch pays it again. It is never more than the cheapest batch size's own time (a
    line steered by a size seen rarely, or sloping down, would say more: a slow first batch of one then read as a
    fixed cost of seconds for a model whose batches take milliseconds). No wait is ever longer than ``fixed``: past
    it, running a second batch would have cost less than the wait (the ski-rental bound), so a wrong guess costs at
    most one batch's time;
  * what its waits brought: the share of waits that brought a job (the hit rate), how long waits took, and when,
    from a wait's start, jobs came. Clients that send again once answered come back together, within a few ms.

  Server time decides. A wait that brings jobs saves a batch, ``fixed`` seconds of the model's time; every wait
  costs its length, in which the model is idle. So it waits where the saving has been worth more than the idle
  time: hit rate × ``fixed`` > the mean length of a wait. A wait lasts 1.5 × the 90th percentile of when jobs came
  (2 ms before any came; jobs that come near the end raise it, so a window too short grows), at most ``fixed``,
  and ends early at a full batch. Where waits do not pay it runs at once, and tries one now and then (after 2, 4,
  8 … 32 batches) so a change of traffic is seen: the last 16 waits decide.

Under a steady backlog batches are full and none of this runs; with one client there is never anyone to wait for,
and it learns that after a few probes.
"""

from __future__ import annotations

import logging
import math
import statistics
from collections import deque
from dataclasses import dataclass

log = logging.getLogger(__name__)

# Waits remembered (what they brought, how long they took): few, so a change of traffic shows within a few probes.
WAITS = 16
# Gaps between arrivals remembered, and the most weight one batch size has in the batch-time line.
MEMORY = 64
# Before this many waits were seen, waiting is assumed to pay (it is tried).
MIN_WAITS = 8
# A wait's window: STRETCH × this percentile of when jobs came in the waits seen; before any, PRIOR_WINDOW_S (two
# looks): a window starts short and grows where jobs come near its end, so a slow model's first tries cost little.
PERCENTILE = 0.9
STRETCH = 1.5
PRIOR_WINDOW_S = 0.002
# No window is longer, whatever a batch costs: a job held popped but unstarted for a minute is taken back.
MAX_WINDOW_S = 10.0
# The longest run of batches without a probe while waiting does not pay.
MAX_PROBE_EVERY = 32
# A fixed cost below this is no reason to wait: it is less than a look for more jobs costs.
MIN_FIXED_S = 0.0005
# A batch size's time is the median of its last this many batches: an outlier is outvoted, a change followed
# within a few batches.
SAMPLES = 9


@dataclass(frozen=True)
class Wait:
    """One collect's wait: up to ``total_s`` from its start, or until the batch is full."""

    total_s: float


class Curve:
    """A model's batch time by batch size, and the line through it."""

    def __init__(self) -> None:
        self.seconds: dict[int, float] = {}
        self.counts: dict[int, int] = {}
        self._recent: dict[int, deque[float]] = {}

    def add(self, size: int, seconds: float) -> None:
        if size < 1 or not math.isfinite(seconds) or seconds < 0:
            return
        recent = self._recent.setdefault(size, deque(maxlen=SAMPLES))
        recent.append(seconds)
        self.seconds[size] = statistics.median(recent)
        self.counts[size] = self.counts.get(size, 0) + 1

    def line(self) -> tuple[float, float] | None:
        """(fixed, per_item) in seconds, from at least two batch sizes; None before."""
        if len(self.seconds) < 2:
            return None
        # Each size weighs as often as it was seen, up to a cap: one rare size does not tilt the line alone.
        weights = {b: min(n, MEMORY) for b, n in self.counts.items()}
        total = sum(weights.values())
        mean_b = sum(w * b for b, w in weights.items()) / total
        mean_t = sum(w * self.seconds[b] for b, w in weights.items()) / total
        var = sum(w * (b - mean_b) ** 2 for b, w in weights.items())
        if var <= 0:
            return None
        per_item = sum(w * (b - mean_b) * (self.seconds[b] - mean_t) for b, w in weights.items()) / var
        return mean_t - per_item * mean_b, per_item

    def fixed_s(self) -> float | None:
        """A batch's fixed cost: the line's intercept, at most the time the cheapest batch size takes (None before
        the line is known)."""
        line = self.line()
        return None if line is None else min(line[0], min(self.seconds.values()))


class AdaptiveWait:
    """The adaptive policy for one model (module docstring)."""

    def __init__(self, model: str = "") -> None:
        self.model = model
        self._said: bool | None = None
        self.curve = Curve()
        self.hits: deque[bool] = deque(maxlen=WAITS)
        self.lengths: deque[float] = deque(maxlen=WAITS)
        self.arrivals: deque[float] = deque(maxlen=MEMORY)
        self._probe_every = 1
        self._since_probe = 0

    def fixed_cost_s(self) -> float | None:
        fixed = self.curve.fixed_s()
        return fixed if fixed is not None and fixed >= MIN_FIXED_S else None

    def hit_rate(self) -> float | None:
        return sum(self.hits) / len(self.hits) if len(self.hits) >= MIN_WAITS else None

    def window_s(self, fixed: float) -> float:
        """How long a wait lasts: ``STRETCH`` × the 90th percentile of when jobs came in the waits seen, at most
        ``fixed``. Jobs that come near a window's end raise the percentile, so a window too short grows."""
        if len(self.arrivals) < MIN_WAITS:
            return min(fixed, PRIOR_WINDOW_S)
        ordered = sorted(self.arrivals)
        return min(MAX_WINDOW_S, fixed, STRETCH * ordered[min(len(ordered) - 1, int(PERCENTILE * len(ordered)))])

    def pays(self) -> bool | None:
        """Whether waits have saved more of the model's time than they left it idle (None: not known yet)."""
        fixed = self.fixed_cost_s()
        return None if fixed is None else self._pays(fixed)

    def _pays(self, fixed: float) -> bool:
        rate = self.hit_rate()
        if rate is None:
            return True  # too few waits seen: they are tried
        return rate * fixed > sum(self.lengths) / len(self.lengths)

    def plan(self, held: int, max_batch: int) -> Wait | None:
        """The wait for a batch holding ``held`` jobs, or None to run at once."""
        if held >= max_batch:
            return None
        fixed = self.fixed_cost_s()
        if fixed is None:
            return None  # the curve is not known: nothing says a wait would pay
        pays = self._pays(fixed)
        if pays != self._said:
            self._said = pays
            self._tell(pays, fixed)
        if pays:
            self._probe_every, self._since_probe = 1, 0
            return Wait(self.window_s(fixed))
        self._since_probe += 1
        if self._since_probe < self._probe_every:
            return None
        self._since_probe = 0
        self._probe_every = min(MAX_PROBE_EVERY, self._probe_every * 2)
        return Wait(self.window_s(fixed))

    def _tell(self, pays: bool, fixed: float) -> None:
        rate = self.hit_rate()
        lengths = sum(self.lengths) / len(self.lengths) if self.lengths else 0.0
        curve = ", ".join(f"{b}: {1000 * t:.1f}" for b, t in sorted(self.curve.seconds.items()))
        log.info(
            "model %s: batches %s: a batch's fixed cost %.1f ms (ms by batch size: %s), %s of waits brought a job,"
            " a wait took %.1f ms",
            self.model,
            "wait for more jobs" if pays else "run at once (a wait is tried now and then)",
            1000 * fixed,
            curve,
            "none yet" if rate is None else f"{rate:.0%}",
            1000 * lengths,
        )

    def waited(self, arrivals: list[float], seconds: float) -> None:
        """A wait of ``seconds`` ended; ``arrivals``: when, from its start, each look that found jobs found them
        (none: a miss)."""
        self.hits.append(bool(arrivals))
        self.lengths.append(seconds)
        self.arrivals.extend(arrivals)

    def ran(self, size: int, seconds: float) -> None:
        """A batch of ``size`` took ``seconds`` from its start to the end of its forward."""
        self.curve.add(size, seconds)


class _Unlearned:
    """A policy that learns nothing: what the worker tells it is dropped."""

    def waited(self, arrivals: list[float], seconds: float) -> None:
        pass

    def ran(self, size: int, seconds: float) -> None:
        pass


class FixedWait(_Unlearned):
    """``INFERQ_MAX_WAIT_MS``: always wait up to that long for a full batch."""

    def __init__(self, max_wait_s: float) -> None:
        self._wait = Wait(max_wait_s)

    def plan(self, held: int, max_batch: int) -> Wait | None:
        return self._wait if held < max_batch else None


class Greedy(_Unlearned):
    """Never wait."""

    def plan(self, held: int, max_batch: int) -> Wait | None:
        return None


Policy = AdaptiveWait | FixedWait | Greedy


def policy_for(batch_wait: str, max_wait_ms: float, model: str = "") -> Policy:
    """A model's policy: a fixed wait where ``max_wait_ms`` is set, else ``batch_wait``'s."""
    if max_wait_ms > 0:
        return FixedWait(max_wait_ms / 1000.0)
    return AdaptiveWait(model) if batch_wait == "adaptive" else Greedy()
