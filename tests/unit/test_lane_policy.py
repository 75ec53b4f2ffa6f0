"""The lane policy (workers/lanes.py) alone: which queues a claim tries, in which order, and when it first
anticipates interactive work. No Redis, no clock: plans in, claims reported back."""

from __future__ import annotations

import ast
from pathlib import Path

from inferq.workers import lanes
from inferq.workers.lanes import ClaimPlan, LanePolicy


def _policy(*models: str, bulk_share: float = 0.1, bulk_anticipate_ms: float = 20.0) -> LanePolicy:
    return LanePolicy(list(models), bulk_share, bulk_anticipate_ms)


def test_one_model_tries_interactive_then_bulk_and_blocks_on_its_interactive_queue() -> None:
    assert _policy("a").plan() == ClaimPlan(
        order=["inferq.a", "inferq.a.bulk"],
        block_on="inferq.a",
        anticipate=[],
        bulk=["inferq.a.bulk"],
        anticipate_s=0.02,
    )


def test_several_models_try_every_interactive_lane_before_any_bulk_lane_and_block_on_none() -> None:
    plan = _policy("a", "b", "c").plan()
    assert plan.order == ["inferq.a", "inferq.b", "inferq.c", "inferq.a.bulk", "inferq.b.bulk", "inferq.c.bulk"]
    assert plan.block_on is None


def test_models_take_turns_the_next_claim_starting_after_the_model_just_served() -> None:
    policy = _policy("a", "b", "c")
    policy.claimed("inferq.b")
    assert policy.plan().order[:3] == ["inferq.c", "inferq.a", "inferq.b"]
    policy.claimed("inferq.c")  # the last model: the turn wraps to the first
    assert policy.plan().order[:3] == ["inferq.a", "inferq.b", "inferq.c"]
    policy.claimed("inferq.a.bulk")  # a bulk claim moves the turn too
    assert policy.plan().order == [
        "inferq.b",
        "inferq.c",
        "inferq.a",
        "inferq.b.bulk",
        "inferq.c.bulk",
        "inferq.a.bulk",
    ]


def test_the_bulk_lane_goes_first_on_every_bulk_every_th_batch() -> None:
    policy = _policy("a", "b", bulk_share=0.1)
    assert policy.bulk_every == 10
    for _ in range(8):
        policy.claimed("inferq.a")
        assert policy.plan().order[0] == "inferq.b"
    policy.claimed("inferq.a")  # the 9th interactive batch in a row: the 10th claim lets bulk go first
    assert policy.plan().order == ["inferq.b.bulk", "inferq.a.bulk", "inferq.b", "inferq.a"]


def test_a_bulk_claim_starts_the_count_again() -> None:
    policy = _policy("a", bulk_share=0.5)
    policy.claimed("inferq.a")
    assert policy.plan().order == ["inferq.a.bulk", "inferq.a"]
    policy.claimed("inferq.a.bulk")
    assert policy.plan().order == ["inferq.a", "inferq.a.bulk"]
    policy.claimed("inferq.a")
    assert policy.plan().order == ["inferq.a.bulk", "inferq.a"]


def test_the_share_is_rounded_to_every_n_th_batch_and_a_share_of_one_always_puts_bulk_first() -> None:
    assert [_policy("a", bulk_share=share).bulk_every for share in (0.1, 0.25, 0.3, 0.6, 1.0)] == [10, 4, 3, 2, 1]
    policy = _policy("a", bulk_share=1.0)
    for name in ("inferq.a", "inferq.a.bulk", "inferq.a"):
        plan = policy.plan()
        assert plan.order == ["inferq.a.bulk", "inferq.a"]
        assert plan.anticipate == []  # bulk goes first: nothing to anticipate
        policy.claimed(name)


def test_after_an_interactive_batch_interactive_work_is_anticipated_in_turn() -> None:
    policy = _policy("a", "b", bulk_anticipate_ms=20.0)
    policy.claimed("inferq.a")
    plan = policy.plan()
    assert plan.anticipate == ["inferq.b", "inferq.a"]
    assert plan.bulk == ["inferq.b.bulk", "inferq.a.bulk"]  # a chunk waiting there is what the wait is for
    assert plan.anticipate_s == 0.02
    assert plan.order == ["inferq.b", "inferq.a", "inferq.b.bulk", "inferq.a.bulk"]
    one = _policy("a", bulk_anticipate_ms=20.0)
    one.claimed("inferq.a")
    assert (one.plan().anticipate, one.plan().block_on) == (["inferq.a"], "inferq.a")


def test_nothing_is_anticipated_first_after_a_bulk_batch_nor_with_anticipation_off() -> None:
    fresh = _policy("a")
    assert fresh.plan().anticipate == []  # no batch yet
    policy = _policy("a")
    policy.claimed("inferq.a.bulk")
    assert policy.plan().anticipate == []
    off = _policy("a", bulk_anticipate_ms=0.0)
    off.claimed("inferq.a")
    assert off.plan().anticipate == []
    assert off.plan().order == ["inferq.a", "inferq.a.bulk"]


def test_nothing_is_anticipated_when_the_bulk_lane_goes_first() -> None:
    policy = _policy("a", bulk_share=0.5)
    policy.claimed("inferq.a")
    plan = policy.plan()
    assert plan.order[0] == "inferq.a.bulk"
    assert plan.anticipate == []


def test_a_plan_changes_nothing_until_a_claim_is_reported() -> None:
    policy = _policy("a", "b")
    policy.claimed("inferq.a")
    assert policy.plan() == policy.plan()
    assert (policy.turn, policy.since_bulk) == (1, 1)


def test_the_policy_reaches_no_redis_and_no_clock() -> None:
    tree = ast.parse(Path(lanes.__file__).read_text(encoding="utf-8"))
    imports = [node for node in ast.walk(tree) if isinstance(node, ast.Import | ast.ImportFrom)]
    modules = {alias.name for node in imports if isinstance(node, ast.Import) for alias in node.names}
    modules |= {node.module or "" for node in imports if isinstance(node, ast.ImportFrom)}
    assert {name.split(".")[0] for name in modules} <= {"__future__", "collections", "dataclasses", "inferq"}
    from_shared = [
        (node.module, alias.name) for node in imports if isinstance(node, ast.ImportFrom) for alias in node.names
    ]
    inferq = [pair for pair in from_shared if (pair[0] or "").startswith("inferq")]
    assert inferq == [("inferq.shared", "keys")]  # names only
