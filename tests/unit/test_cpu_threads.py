"""INFERQ_CPU_THREADS (workers/cpu_threads.py): the forwards' thread count, fixed or measured; a fake clock and
made-up forward times, so every decision is the code's, never the machine's."""

from __future__ import annotations

import pytest

from inferq.shared.settings import Settings
from inferq.workers import cpu_threads
from inferq.workers.cpu_threads import ThreadTuner, candidates, tuner_for


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def run(tuner: ThreadTuner, per_item_s: dict[int, float], batches: int, items: int = 8, model: str = "m") -> list[int]:
    """``batches`` forwards of ``items`` items, each costing ``per_item_s[threads]`` an item; the counts used."""
    used = []
    for _ in range(batches):
        tuner.before(model)
        used.append(tuner.current)
        tuner.observe(model, per_item_s[tuner.current] * items, items)
    return used


def make(cores: int, fixed: int | None = None) -> tuple[ThreadTuner, Clock, list[int]]:
    clock, told = Clock(), []
    tuner = ThreadTuner(cores, fixed, clock=clock, set_threads=told.append, get_threads=lambda: told[-1] if told else 0)
    return tuner, clock, told


def test_a_count_someone_else_changed_is_set_again_before_the_next_forward() -> None:
    """torch's thread count is the process's: three workers in one process (make bench's overlap row) each trusted
    the count it had set last, and one ran at the single thread another's measure had left, at half speed."""
    clock, process = Clock(), [2]

    def set_threads(count: int) -> None:
        process[0] = count

    a, b = (ThreadTuner(2, clock=clock, set_threads=set_threads, get_threads=lambda: process[0]) for _ in range(2))
    for tuner in (a, b):
        run(tuner, {1: 22.8e-3, 2: 13.3e-3}, 40)
        assert tuner.chosen == 2 and not tuner.tuning
    clock.now += a.exploit_s  # a measures again: its next forwards take one thread, then two...
    b.settled_at = clock.now  # ...while b's choice still stands
    a.before("m")
    a.before("m")
    a.before("m")
    assert process[0] == 1
    b.before("m")
    assert process[0] == 2  # b's forward runs on b's count


def test_the_candidates_are_powers_of_two_and_the_core_count() -> None:
    assert candidates(1) == [1]
    assert candidates(2) == [1, 2]
    assert candidates(6) == [1, 2, 4, 6]
    assert candidates(16) == [1, 2, 4, 8, 16]


def test_small_ops_that_stall_on_two_threads_move_to_one() -> None:
    """The langid case: one thread costs less per item than two under load."""
    tuner, _, told = make(2)
    used = run(tuner, {1: 0.64e-3, 2: 1.02e-3}, 400)
    assert set(used[:10]) == {1, 2}  # measured in turn, batch by batch
    assert tuner.chosen == 1 and not tuner.tuning
    assert used[-5:] == [1] * 5
    assert told[-1] == 1


def test_a_convolution_that_scales_keeps_every_core() -> None:
    tuner, _, _ = make(2)
    run(tuner, {1: 22.8e-3, 2: 13.3e-3}, 40)
    assert tuner.chosen == 2 and not tuner.tuning


def test_a_candidate_within_the_margin_does_not_replace_the_count_in_use() -> None:
    tuner, _, _ = make(2)
    run(tuner, {1: 0.98e-3, 2: 1.0e-3}, 400)  # 2 % cheaper: noise
    assert tuner.chosen == 2


def test_each_count_is_measured_long_enough_before_a_decision() -> None:
    tuner, _, _ = make(2)
    run(tuner, {1: 1e-6, 2: 2e-6}, 20)  # 20 fast forwards: far from WINDOW_S of forward time
    assert tuner.tuning and tuner.chosen == 2


def test_the_choice_is_measured_again_once_it_has_stood_a_while() -> None:
    """The load changes: after EXPLOIT_S, the count in use and its neighbours are measured again."""
    tuner, clock, _ = make(4)
    run(tuner, {1: 2e-3, 2: 1e-3, 4: 1.5e-3}, 300)
    assert tuner.chosen == 2
    assert run(tuner, {1: 2e-3, 2: 1e-3, 4: 1.5e-3}, 5) == [2] * 5  # standing
    clock.now += cpu_threads.EXPLOIT_S
    used = run(tuner, {1: 0.5e-3, 2: 1e-3, 4: 1.5e-3}, 600)
    assert set(used[:3]) == {1, 2, 4}
    assert tuner.chosen == 1


def test_a_clear_choice_is_measured_less_and_less_often_and_a_change_measures_often_again() -> None:
    """Measuring runs forwards at the worse counts: a choice each measure confirms clearly waits twice as long."""
    tuner, clock, _ = make(2)
    scaling = {1: 22.8e-3, 2: 13.3e-3}  # one thread costs 71 % more an item: clear
    run(tuner, scaling, 40)
    assert tuner.chosen == 2 and tuner.exploit_s == 2 * cpu_threads.EXPLOIT_S  # torch's default, confirmed clearly
    waits = []
    for _ in range(6):
        clock.now += tuner.exploit_s
        run(tuner, scaling, 40)
        assert not tuner.tuning
        waits.append(tuner.exploit_s)
    assert waits == [120.0, 240.0, 480.0, 480.0, 480.0, 480.0]
    clock.now += tuner.exploit_s - 1
    assert run(tuner, scaling, 3) == [2, 2, 2]  # still standing
    clock.now += 1
    run(tuner, {1: 10e-3, 2: 13.3e-3}, 40)  # the load changed: one thread is cheaper now
    assert tuner.chosen == 1 and tuner.exploit_s == cpu_threads.EXPLOIT_S


def test_a_close_call_keeps_measuring_at_the_first_interval() -> None:
    tuner, clock, _ = make(2)
    close = {1: 1.1e-3, 2: 1.0e-3}  # one thread 10 % dearer: kept, but not clear
    run(tuner, close, 400)
    for _ in range(3):
        clock.now += tuner.exploit_s
        run(tuner, close, 400)
        assert tuner.chosen == 2 and tuner.exploit_s == cpu_threads.EXPLOIT_S


def test_the_model_with_most_items_decides() -> None:
    tuner, _, _ = make(2)
    for _ in range(200):  # served alternately: each still meets both counts
        run(tuner, {1: 1e-3, 2: 2e-3}, 1, items=8, model="big")
        run(tuner, {1: 2e-3, 2: 1e-3}, 1, items=1, model="small")
    assert not tuner.tuning and tuner.chosen == 1


def test_a_fixed_count_is_set_once_and_never_measured() -> None:
    tuner, clock, told = make(8, fixed=3)
    run(tuner, {3: 1e-3}, 10)
    clock.now += 10 * cpu_threads.EXPLOIT_S
    run(tuner, {3: 1e-3}, 10)
    assert told == [3] and not tuner.tuning


def test_one_core_leaves_nothing_to_measure() -> None:
    tuner, _, told = make(1)
    run(tuner, {1: 1e-3}, 10)
    assert told == [1] and not tuner.tuning


def test_the_setting_reads_a_count_or_auto(monkeypatch: pytest.MonkeyPatch) -> None:
    assert Settings().cpu_threads == "auto"
    monkeypatch.setenv("INFERQ_CPU_THREADS", "3")
    assert Settings().cpu_threads == 3
    monkeypatch.setenv("INFERQ_CPU_THREADS", "0")
    with pytest.raises(ValueError, match="cpu_threads"):
        Settings()


def test_a_cuda_worker_keeps_torchs_threads_unless_told_a_count() -> None:
    assert tuner_for("auto", cuda=True) is None
    fixed = tuner_for(2, cuda=True)
    assert fixed is not None and fixed.fixed == 2
    measured = tuner_for("auto", cuda=False)
    assert measured is not None and measured.fixed is None
