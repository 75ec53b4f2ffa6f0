"""The fill wait's decisions (workers/fill.py): what each policy waits for, and what the adaptive one learns."""

from __future__ import annotations

import pytest

from inferq.workers.fill import (
    MAX_PROBE_EVERY,
    MAX_WINDOW_S,
    PRIOR_WINDOW_S,
    STRETCH,
    AdaptiveWait,
    FixedWait,
    Greedy,
    Wait,
    policy_for,
)


def _learned(fixed_s: float = 0.006, per_item_s: float = 0.016) -> AdaptiveWait:
    policy = AdaptiveWait()
    for size in (1, 2, 3, 4):
        policy.ran(size, fixed_s + per_item_s * size)
    return policy


def test_the_policy_follows_the_settings() -> None:
    assert isinstance(policy_for("adaptive", 0.0), AdaptiveWait)
    assert isinstance(policy_for("greedy", 0.0), Greedy)
    fixed = policy_for("adaptive", 5.0)  # INFERQ_MAX_WAIT_MS set: a fixed wait, whatever the policy
    assert isinstance(fixed, FixedWait) and fixed.plan(1, 8) == Wait(0.005)
    assert fixed.plan(8, 8) is None
    assert Greedy().plan(1, 8) is None


def test_the_batch_time_line_is_fitted_from_the_sizes_run() -> None:
    policy = _learned(0.006, 0.016)
    line = policy.curve.line()
    assert line == pytest.approx((0.006, 0.016))
    assert policy.fixed_cost_s() == pytest.approx(0.006)


def test_no_wait_before_two_batch_sizes_were_timed() -> None:
    policy = AdaptiveWait()
    for _ in range(20):
        policy.ran(1, 0.02)  # one client: only batches of one, so no line and no fixed cost
    assert policy.curve.line() is None
    assert all(policy.plan(1, 8) is None for _ in range(100))


def test_no_wait_where_a_batch_has_no_fixed_cost() -> None:
    policy = AdaptiveWait()
    for size in (1, 2, 4, 8):
        policy.ran(size, 0.01 * size)  # time in proportion to the size: merging saves nothing
    assert policy.fixed_cost_s() is None
    assert policy.plan(1, 8) is None


def test_a_full_batch_never_waits() -> None:
    assert _learned().plan(8, 8) is None


def test_waits_are_tried_first_and_never_longer_than_the_fixed_cost() -> None:
    policy = _learned(0.006)
    wait = policy.plan(2, 8)
    assert wait is not None
    assert wait.total_s == pytest.approx(PRIOR_WINDOW_S)  # nothing seen yet: a short first window
    for _ in range(10):
        policy.waited([0.005, 0.0055], 0.006)  # jobs came late in the waits: the window grows, up to the cap
    assert policy.plan(2, 8) == Wait(pytest.approx(0.006))
    slow = _learned(200.0, 1.0)  # a batch's fixed cost of minutes: the window stays far from RQ's minute
    for _ in range(10):
        slow.waited([30.0], 40.0)
    wait = slow.plan(1, 8)
    assert wait is not None and wait.total_s == MAX_WINDOW_S


def test_the_window_is_learned_from_when_jobs_came() -> None:
    policy = _learned(0.020)
    for _ in range(10):
        # Clients answered together come back together: the jobs came 1 to 2 ms into each wait.
        policy.waited([0.001, 0.0015, 0.002], 0.003)
    wait = policy.plan(2, 8)
    assert wait is not None
    assert wait.total_s == pytest.approx(STRETCH * 0.002)


def test_a_window_too_short_grows() -> None:
    policy = _learned(0.020)
    for _ in range(10):
        policy.waited([0.001], 0.002)
    short = policy.window_s(0.020)
    for _ in range(30):
        wait = policy.plan(1, 8)
        assert wait is not None
        policy.waited([0.9 * wait.total_s], wait.total_s)  # jobs keep coming near the window's end
    assert policy.window_s(0.020) > 2 * short


def test_waits_that_bring_nothing_stop_and_are_probed_less_and_less_often() -> None:
    policy = _learned(0.006)
    plans = []
    for _ in range(400):
        wait = policy.plan(1, 8)
        plans.append(wait is not None)
        if wait is not None:
            policy.waited([], 0.006)  # nobody came
    # The first waits are tried; then probes 2, 4, 8 … batches apart, at most MAX_PROBE_EVERY.
    assert plans[:8] == [True] * 8
    probes = [i for i, waited in enumerate(plans) if waited and i >= 8]
    spacing = [b - a for a, b in zip(probes, probes[1:], strict=False)]
    assert spacing[:5] == [2, 4, 8, 16, 32]
    assert set(spacing[5:]) == {MAX_PROBE_EVERY}
    assert sum(plans) == 8 + len(probes)


def test_waiting_comes_back_once_waits_pay_again() -> None:
    policy = _learned(0.006)
    for _ in range(8):
        policy.plan(1, 8)
        policy.waited([], 0.006)
    assert policy.pays() is False
    probes = 0
    for _ in range(400):  # traffic changed: each probe brings jobs within a millisecond
        if policy.plan(1, 8) is not None:
            probes += 1
            policy.waited([0.0005], 0.001)
        if policy.pays():
            break
    assert policy.pays() is True
    assert probes <= 10  # the last 16 waits decide: a few probes that pay are enough
    assert policy.plan(1, 8) is not None


def test_waiting_pays_where_the_time_saved_beats_the_time_idle() -> None:
    policy = _learned(0.006)
    # Half the waits bring jobs and end 2 ms in, the others find nobody in 1 ms: 0.5 × 6 ms saved, 1.5 ms idle.
    for i in range(16):
        policy.waited([0.001], 0.002) if i % 2 else policy.waited([], 0.001)
    assert policy.pays() is True
    # Every wait brings jobs, but takes longer than the batch it saves: the model would have run the next batch.
    slow = _learned(0.003)
    for _ in range(16):
        slow.waited([0.002, 0.004, 0.006], 0.009)
    assert slow.pays() is False
    # It runs at once, trying a wait after 1, 2, 4 … batches.
    assert [slow.plan(2, 8) is not None for _ in range(7)] == [True, False, True, False, False, False, True]


def test_a_changing_batch_time_moves_the_line() -> None:
    policy = _learned(0.006, 0.016)
    for _ in range(30):  # the machine got busier: every batch size takes 10 ms longer
        for size in (1, 2, 3, 4):
            policy.ran(size, 0.016 + 0.016 * size)
    assert policy.fixed_cost_s() == pytest.approx(0.016, rel=0.01)


def test_nonsense_times_are_ignored() -> None:
    policy = _learned()
    before = policy.curve.line()
    policy.ran(0, 1.0)
    policy.ran(2, float("nan"))
    policy.ran(3, -1.0)
    assert policy.curve.line() == before


def _windows(policy: AdaptiveWait, waits: int) -> list[float]:
    """The windows of ``waits`` waits in which a job comes near the end each time (a window too short grows)."""
    opened = []
    for _ in range(waits):
        wait = policy.plan(1, 8)
        if wait is not None:
            opened.append(wait.total_s)
            policy.waited([0.9 * wait.total_s], wait.total_s)
    return opened


def test_a_slow_first_batch_does_not_make_a_fixed_cost_of_seconds() -> None:
    """Issue 45 item 28: a model whose batches take 1.5 ms, whose first batch of one took 1.9 s (its kernels
    compiling). That batch size, seen rarely after, kept its slow time, the line through it sloped down and its
    intercept read as a fixed cost of seconds: windows grew towards it. A batch's fixed cost is at most what the
    model's batches take."""
    policy = AdaptiveWait()
    policy.ran(1, 1.9)
    for i in range(40):
        policy.ran(2, 0.0015)
        if i % 20 == 0:
            policy.ran(1, 0.0014)
    fixed = policy.fixed_cost_s()
    assert fixed is not None and fixed <= 0.0015
    assert max(_windows(policy, 200)) <= 0.0015


def test_a_batch_size_seen_once_and_slow_cannot_raise_the_fixed_cost_past_a_batch() -> None:
    policy = AdaptiveWait()
    for _ in range(30):
        policy.ran(2, 0.0015)
        policy.ran(3, 0.0016)
    policy.ran(1, 1.0)  # once, and slow: the line through it slopes down to an intercept of seconds
    fixed = policy.fixed_cost_s()
    assert fixed is not None and fixed <= 0.0015
    assert max(_windows(policy, 200)) <= 0.0015


def test_one_slow_batch_among_many_moves_nothing() -> None:
    policy = _learned(0.006, 0.016)
    for _ in range(8):
        policy.ran(2, 0.038)
    policy.ran(2, 2.0)  # the host stalled once
    assert policy.fixed_cost_s() == pytest.approx(0.006)
