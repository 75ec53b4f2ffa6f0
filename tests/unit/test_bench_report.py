"""The benchmark's shards row: a ratio short of 1.8x reads as bound by the cores only when the profile says so."""

from __future__ import annotations

from typing import Any

from bench import report


def _shards(ratio: float, cpus: int, one_cores: float) -> dict[str, Any]:
    one = {"jobs_per_s": 1000.0, "cpu_cores": {"redis 0": one_cores / 2, "workers": one_cores / 2}}
    two = {"jobs_per_s": 1000.0 * ratio, "cpu_cores": {"redis 0": 0.5, "redis 1": 0.5}}
    return {"shards": {"one_redis": one, "two_redis": two, "ratio": ratio, "cpus": cpus}}


def test_short_of_the_target_on_saturated_cores_is_bound_by_them() -> None:
    (row,) = report.shards_rows(_shards(1.34, cpus=2, one_cores=1.43))  # the cores allow 1.40x
    assert row["holds"] is None and row["state"] == "bound by the cores (96% of what they allow)"
    assert "at most 1.40x" in row["detail"]


def test_short_of_the_target_with_cores_to_spare_fails() -> None:
    (row,) = report.shards_rows(_shards(1.35, cpus=8, one_cores=1.43))
    assert row["holds"] is False
    (row,) = report.shards_rows(_shards(1.0, cpus=2, one_cores=1.43))  # far below what the cores allow
    assert row["holds"] is False


def test_the_target_met_holds() -> None:
    (row,) = report.shards_rows(_shards(1.9, cpus=8, one_cores=1.0))
    assert row["holds"] is True
