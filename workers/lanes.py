"""Which queue a worker claims from next: the lane policy, with no Redis and no clock (decisions only).

Interactive lanes first, models in turn; the bulk lanes fill in when no interactive work waits, and go first
on every ``bulk_every``-th batch (``INFERQ_BULK_SHARE``), so steady interactive load never starves them. After
an interactive batch, while a bulk chunk waits, interactive work gets ``INFERQ_BULK_ANTICIPATE_MS`` to arrive
before the chunk takes the model. The worker runs a ``ClaimPlan`` against Redis and reports what it claimed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from inferq.shared import keys


@dataclass(frozen=True)
class ClaimPlan:
    """One claim's decisions, for the worker to run against Redis.

    With ``anticipate`` (interactive queues, in turn): try them at once; with none waiting there but work waiting
    in ``bulk``, wait up to ``anticipate_s`` on them. Then, if nothing was claimed, claim from ``order`` with the
    caller's timeout. ``block_on`` is the queue a blocking wait blocks on (a one-model worker's interactive queue).
    """

    order: list[str]
    block_on: str | None
    anticipate: list[str]
    bulk: list[str]
    anticipate_s: float


class LanePolicy:
    """A worker's claim order over its models' interactive and bulk queues."""

    def __init__(self, models: Sequence[str], bulk_share: float, bulk_anticipate_ms: float) -> None:
        self.models = list(models)
        self.interactive = [keys.queue_name(model, keys.INTERACTIVE) for model in self.models]
        self.bulk = [keys.queue_name(model, keys.BULK) for model in self.models]
        self.bulk_every = max(1, round(1 / bulk_share))
        self.anticipate_s = bulk_anticipate_ms / 1000
        self.turn = 0  # which model a multi-model worker tries first on its next claim
        # Interactive batches since a bulk one; the bulk lane goes first when this reaches `bulk_every` - 1.
        self.since_bulk = 0

    def plan(self) -> ClaimPlan:
        """Where the next claim looks, in which order, and whether it first anticipates interactive work."""
        turn = self.turn % len(self.models)
        interactive = self.interactive[turn:] + self.interactive[:turn]
        bulk = self.bulk[turn:] + self.bulk[:turn]
        bulk_first = self.since_bulk + 1 >= self.bulk_every
        order = bulk + interactive if bulk_first else interactive + bulk
        block_on = self.interactive[0] if len(self.models) == 1 else None
        # The last batch was interactive: its client's next request gets a moment to arrive before a waiting bulk
        # chunk takes the model; with no bulk chunk waiting, nothing is waited for (a --burst worker stops now).
        anticipating = self.since_bulk > 0 and not bulk_first and self.anticipate_s > 0
        return ClaimPlan(order, block_on, interactive if anticipating else [], bulk, self.anticipate_s)

    def claimed(self, queue_name: str) -> None:
        """A job was claimed from ``queue_name``: count the lane, and the next claim starts after its model."""
        self.since_bulk = 0 if keys.lane_of(queue_name) == keys.BULK else self.since_bulk + 1
        self.turn = self.models.index(keys.model_from_queue(queue_name)) + 1
