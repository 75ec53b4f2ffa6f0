"""How many threads a CPU worker's forwards use (``INFERQ_CPU_THREADS``): a number, or ``auto``, chosen from how
fast the forwards really run.

Torch starts one intra-op thread per core. A forward's parallel regions wait for their slowest thread, so where the
API, Redis and other workers share the cores, a thread that loses its core stalls the rest. Measured on 2 cores:
serving the langid text model (small batches, small ops) at 16 clients, one thread ran 1.3x the texts per second
of two; a ResNet-sized convolution at batch 8 still runs nearly twice as fast on two as on one. No fixed count is
right for both, nor for one model under every load.

``auto`` measures instead. Its forwards take the candidate counts (1, 2, 4, ... up to the cores this process may
use) in turn until each has run ``MIN_BATCHES`` forwards and ``WINDOW_S`` of forward time; it keeps the count whose
forwards cost the least time per item, and after ``EXPLOIT_S`` measures that count and its neighbours again, since
the load changes. A candidate replaces the one in use only when it is ``MARGIN`` cheaper, so noise does not flip
it. Measuring costs the forwards run at the worse counts (a ResNet-sized convolution runs half as fast on one thread
as on two): a choice that each measure confirms by ``CLEAR`` stands twice as long before the next, up to
``MAX_EXPLOIT_S``; a closer call or a change starts again at ``EXPLOIT_S``. A worker serving several models judges
by the model that ran the most items in the window. A worker with a CUDA model leaves torch's default alone (the
forwards run on the GPU).

Written here rather than taken from a library: no maintained package tunes torch's intra-op threads online.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

log = logging.getLogger("inferq.workers.cpu_threads")

MIN_BATCHES = 3  # each count is measured on at least this many forwards...
WINDOW_S = 0.5  # ...and at least this much forward time
EXPLOIT_S = 30.0  # how long a choice stands before it and its neighbours are measured again...
MAX_EXPLOIT_S = 480.0  # ...doubling up to this while every measure confirms it clearly
MARGIN = 0.05  # a candidate must cost this much less per item than the count in use to replace it
CLEAR = 0.25  # a choice whose neighbours all cost this much more per item is clear: the next measure waits longer


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity, which containers and taskset narrow)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


def candidates(cores: int) -> list[int]:
    """1, 2, 4, ... and the core count itself."""
    out = {cores}
    count = 1
    while count < cores:
        out.add(count)
        count *= 2
    return sorted(out)


@dataclass
class _Tally:
    seconds: float = 0.0
    items: int = 0
    batches: int = 0
    by_model: dict[str, tuple[float, int]] = field(default_factory=dict)

    def add(self, model: str, seconds: float, items: int) -> None:
        self.seconds += seconds
        self.items += items
        self.batches += 1
        spent, ran = self.by_model.get(model, (0.0, 0))
        self.by_model[model] = (spent + seconds, ran + items)


class ThreadTuner:
    """The intra-op thread count for one worker process: fixed, or measured (module docstring).

    The worker calls ``before()`` ahead of each forward and ``observe()`` after it, from one thread. While it
    measures, the forwards take the candidate counts in turn, batch by batch, so that each count meets the same
    load: measured one after the other, a count tried while one client waited would look worse than one tried
    under 64.
    """

    def __init__(
        self,
        cores: int,
        fixed: int | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        set_threads: Callable[[int], None] = torch.set_num_threads,
        get_threads: Callable[[], int] = torch.get_num_threads,
    ) -> None:
        self.cores = max(1, cores)
        self.fixed = fixed
        self.clock = clock
        self.set_threads = set_threads
        self.get_threads = get_threads
        self.options = candidates(self.cores)
        self.chosen = fixed or self.cores  # torch's own default until measured otherwise
        self.current = 0  # the count the last forward was set to run with (0: none yet)
        self.tallies: dict[int, _Tally] = {}
        self.trying: list[int] = [] if fixed or len(self.options) == 1 else self._round(self.chosen)
        self.turns: dict[str, int] = {}
        self.settled_at = clock()
        self.exploit_s = EXPLOIT_S  # how long the current choice stands before it is measured again

    @property
    def tuning(self) -> bool:
        return bool(self.trying)

    def before(self, model: str) -> None:
        """Set the thread count the next forward (of ``model``) runs with."""
        stood_s = self.clock() - self.settled_at
        if not self.trying and self.fixed is None and len(self.options) > 1 and stood_s >= self.exploit_s:
            self.trying, self.tallies = self._round(self.chosen), {}
        if self.trying:
            # Each model takes the counts in turn: two models served alternately still meet every count.
            turn = self.turns.get(model, 0)
            self.turns[model] = turn + 1
            self._use(self.trying[turn % len(self.trying)])
        else:
            self._use(self.chosen)

    def observe(self, model: str, seconds: float, items: int) -> None:
        """One forward ran ``items`` items of ``model`` in ``seconds`` at the count ``before()`` set."""
        if not self.trying or items <= 0:
            return
        self.tallies.setdefault(self.current, _Tally()).add(model, seconds, items)
        if all(self._measured(count) for count in self.trying):
            self._decide()
            self.trying = []

    def _measured(self, count: int) -> bool:
        tally = self.tallies.get(count)
        return tally is not None and tally.batches >= MIN_BATCHES and tally.seconds >= WINDOW_S

    def _round(self, around: int) -> list[int]:
        """The counts to measure: the one in use, and its neighbours among the candidates."""
        at = self.options.index(around) if around in self.options else len(self.options) - 1
        return self.options[max(0, at - 1) : at + 2]

    def _decide(self) -> None:
        model = max(
            {name for tally in self.tallies.values() for name in tally.by_model},
            key=lambda name: sum(t.by_model.get(name, (0.0, 0))[1] for t in self.tallies.values()),
        )
        costs = {}
        for count, tally in self.tallies.items():
            spent, ran = tally.by_model.get(model, (0.0, 0))
            if ran:
                costs[count] = spent / ran
        best = min(costs, key=lambda count: costs[count])
        previous = self.chosen
        if previous not in costs or costs[best] < costs[previous] * (1 - MARGIN):
            self.chosen = best
        others = [cost for count, cost in costs.items() if count != self.chosen]
        clear = self.chosen == previous and self.chosen in costs and bool(others)
        if clear and min(others) >= costs[self.chosen] * (1 + CLEAR):
            self.exploit_s = min(self.exploit_s * 2, MAX_EXPLOIT_S)
        else:
            self.exploit_s = EXPLOIT_S
        self.settled_at = self.clock()
        shown = ", ".join(f"{count}: {costs[count] * 1000:.2f} ms" for count in sorted(costs))
        level = logging.INFO if self.chosen != previous else logging.DEBUG
        log.log(level, "forwards run on %d thread(s); time per %s item by thread count: %s", self.chosen, model, shown)

    def _use(self, count: int) -> None:
        # torch's count is the process's, not this tuner's: another worker in the process (the benchmark's, a
        # test's) or a handler may have set it since, so it is read, not remembered. Trusting the last count set
        # here ran a worker's forwards on the one thread another's measure had set, at half speed (make bench,
        # three workers in one process).
        if self.get_threads() != count:
            self.set_threads(count)
        self.current = count


def tuner_for(setting: int | str, cuda: bool) -> ThreadTuner | None:
    """The worker's tuner for ``INFERQ_CPU_THREADS``; None leaves torch's threads as they are."""
    if isinstance(setting, int):
        return ThreadTuner(usable_cores(), fixed=setting)
    if cuda:
        return None
    return ThreadTuner(usable_cores())
