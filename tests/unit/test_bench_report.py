"""The benchmark's rows: when each holds, and what it is measured against."""

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


def _fairness(beside_p99_ms: float, ratio: float = 1.0) -> dict[str, Any]:
    small = {
        "model": "digits",
        "batch_ms": 25.0,
        "alone": {"p99_ms": 4.0, "samples": 40},
        "beside_backlog_fair": {"p99_ms": beside_p99_ms, "samples": 40},
        "beside_backlog_fifo": {"p99_ms": 1900.0, "samples": 10},
    }
    return {
        "fairness": {
            "on_jobs_per_s": 1000 * ratio,
            "off_jobs_per_s": 1000,
            "ratio": ratio,
            "submit_us": {"on": 150.0, "off": 140.0},
            "small_tenant": small,
        }
    }


def test_the_fairness_rows_hold_within_one_batch_and_20_ms_of_alone() -> None:
    drain, latency = report.fairness_rows(_fairness(48.9))
    assert drain["holds"] and latency["holds"]  # 4 + 25 + 20 = 49 ms allowed
    assert "without fairness (one FIFO) 1900 ms" in latency["detail"]
    drain, latency = report.fairness_rows(_fairness(49.5, ratio=0.85))
    assert not drain["holds"] and not latency["holds"]


def _vs(*ratios: float) -> dict[str, Any]:
    points = [
        {
            "clients": c,
            "inferq_per_s": 40.0 * r,
            "litserve_per_s": 40.0,
            "inferq_p50_ms": 30.0,
            "litserve_p50_ms": 31.0,
            "ratio": r,
        }
        for c, r in zip((1, 4, 16, 64), ratios, strict=True)
    ]
    return {"litserve": {"points": points, "max_batch": 8, "bare_per_s": 48.0}}


def test_the_litserve_row_holds_only_when_every_load_is_ahead_by_5_percent() -> None:
    (row,) = report.litserve_rows(_vs(1.10, 1.06, 1.05, 1.07))
    assert row["holds"] is True
    (row,) = report.litserve_rows(_vs(1.10, 1.02, 0.99, 1.02))  # the first measurement
    assert row["holds"] is False and row["detail"].startswith("0.99x (lowest at c=16;")
    (row,) = report.litserve_rows({"litserve": {"unavailable": "needs hey"}})
    assert row["holds"] is None and row["detail"] == "needs hey"
    table = report.markdown(
        {
            "machine": {"platform": "p", "cpus": 2, "torch": "t", "device": "cpu"},
            "point_seconds": 6,
            **_vs(1.1, 1.1, 1.1, 1.1),
        }
    )
    assert "| 64 | 44.0 | 40.0 | 1.10× |" in table and "at 64 clients inferq is 0.92× it" in table


def test_the_batch_wait_policies_are_shown_side_by_side_under_the_cnn_table() -> None:
    vs = _vs(1.1, 1.1, 1.1, 1.1)
    policies = [
        {
            "clients": c,
            "inferq": {"per_s": a, "p50_ms": 30.0},
            "inferq greedy": {"per_s": g, "p50_ms": 35.0},
            "inferq fixed 5 ms": {"per_s": f, "p50_ms": 36.0},
        }
        for c, a, g, f in ((1, 30.0, 30.0, 25.0), (4, 40.0, 32.0, 38.0), (16, 44.0, 44.0, 43.0), (64, 44.0, 43.0, 44.0))
    ]
    vs["litserve"]["policies"] = policies
    table = report.markdown(
        {"machine": {"platform": "p", "cpus": 2, "torch": "t", "device": "cpu"}, "point_seconds": 6, **vs}
    )
    assert "| clients | adaptive (the default) img/s | greedy img/s | fixed 5 ms img/s |" in table
    assert "| 4 | 40.0 | 32.0 | 38.0 | 1.25× | 1.05× | 30 / 35 / 36 |" in table
    del vs["litserve"]["policies"]
    assert "greedy img/s" not in report.markdown(
        {"machine": {"platform": "p", "cpus": 2, "torch": "t", "device": "cpu"}, "point_seconds": 6, **vs}
    )


def test_the_litserve_text_row_holds_at_saturation_from_1_3x_and_shows_both_padding_wastes() -> None:
    vs = _vs(1.1, 1.1, 1.1, 1.1)
    text = {**_vs(2.0, 1.5, 1.2, 1.25)["litserve"], "model": "langid", "inputs": 512}
    text["padding_waste"] = {"inferq": 0.18, "litserve": 0.53}
    rows = report.litserve_rows({**vs, "litserve_text": text})
    assert [r["name"] for r in rows] == ["litserve_cnn", "litserve_text"]
    assert rows[1]["holds"] is False  # 1.25x at 64 clients: the target is the saturated load, not the best
    assert rows[1]["detail"] == "1.25x (c=64: 50 vs 40 texts/s; padding waste inferq 18%, litserve 53%)"
    text["points"][-1]["ratio"] = 1.3
    assert report.litserve_rows({**vs, "litserve_text": text})[1]["holds"] is True
    (_, row) = report.litserve_rows({**vs, "litserve_text": {"unavailable": "needs wrk"}})
    assert row["holds"] is None and row["detail"] == "needs wrk"
    table = report.markdown(
        {
            "machine": {"platform": "p", "cpus": 2, "torch": "t", "device": "cpu"},
            **vs,
            "point_seconds": 6,
            "litserve_text": text,
        }
    )
    assert "| 64 | 50.0 | 40.0 | 1.30× |" in table
    assert "Padding waste (padding's share of the token positions run): inferq 18%, litserve 53%." in table


def test_the_digit_drain_row_holds_from_10x_rqs_no_op_drain() -> None:
    drain = {
        "inferq_jobs_per_s": 15000.0,
        "rq_jobs_per_s": 530.0,
        "ratio": 15000 / 530,
        "digits_jobs_per_s": 5000.0,
        "digits_ratio": 5000 / 530,
        "rounds": {"inferq": [15000.0], "rq": [530.0], "digits": [5000.0]},
    }
    noop, digits = report.drain_rows({"drain": drain})
    assert noop["name"] == "drain" and noop["holds"] is True
    assert digits["name"] == "drain_digits" and digits["holds"] is False
    assert digits["detail"] == "9.43x (5000 vs 530 jobs/s, best of 1 alternated)"
    drain["digits_ratio"] = 10.0
    assert report.drain_rows({"drain": drain})[1]["holds"] is True
    del drain["digits_ratio"]
    assert [r["name"] for r in report.drain_rows({"drain": drain})] == ["drain"]


def _resnet(p50_ms: float, per_s: float) -> dict[str, Any]:
    def loop(b1_ms: float, b8_per_s: float) -> dict[str, Any]:
        points = [{"batch": 1, "batch_ms": b1_ms, "items_per_s": 1000 / b1_ms}]
        return {"points": [*points, {"batch": 8, "batch_ms": 8000 / b8_per_s, "items_per_s": b8_per_s}]}

    closed = [{"clients": 1, "p50_ms": p50_ms, "throughput_per_s": 40.0}, {"clients": 64, "throughput_per_s": per_s}]
    return {
        "bare": {"resnet": loop(15.0, 70.0)},  # at the start of the run, when the machine was faster
        "bare_near_resnet": [loop(21.0, 58.0), loop(20.0, 60.0)],
        "systems": {"inferq": {"resnet": {"closed": closed}}},
    }


def test_the_saturation_and_one_client_rows_compare_with_the_faster_bare_loop_beside_them() -> None:
    saturation, one_client = report.saturation_rows(_resnet(p50_ms=24.5, per_s=54.5))
    assert saturation["holds"] and abs(saturation["value"] - 54.5 / 60.0) < 1e-9  # the better neighbour, 60 img/s
    assert one_client["holds"] and abs(one_client["value"] - 4.5) < 1e-9  # 24.5 ms against 20 ms
    assert "right before and after" in saturation["detail"]
    saturation, one_client = report.saturation_rows(_resnet(p50_ms=25.5, per_s=53.0))
    assert not saturation["holds"] and not one_client["holds"]


def test_without_neighbours_the_rows_compare_with_the_bare_loop_at_the_start() -> None:
    results = _resnet(p50_ms=19.0, per_s=64.0)
    del results["bare_near_resnet"]
    saturation, one_client = report.saturation_rows(results)
    assert abs(saturation["value"] - 64.0 / 70.0) < 1e-9 and abs(one_client["value"] - 4.0) < 1e-9
    assert "at the start of the run" in one_client["detail"]


def test_the_saturation_row_reads_the_hey_rounds_against_the_bare_model_as_given_when_they_ran() -> None:
    """Issue 31 measured saturation with hey, one request per image; the asyncio closed loop takes CPU from the
    model on a small machine. The ratio to the model as the worker runs it (fused, channels-last) is in the detail."""
    results = _resnet(p50_ms=24.5, per_s=40.0)  # the closed loop's 40 img/s would miss against 60
    results["litserve"] = {
        "max_batch": 8,
        "points": [
            {"clients": 1, "inferq_per_s": 30.0},
            {"clients": 4, "inferq_per_s": 58.0},  # below saturation: not read
            {"clients": 16, "inferq_per_s": 50.0},
            {"clients": 64, "inferq_per_s": 51.0},
        ],
        "bare_per_s": 46.0,
        "bare_worker_per_s": 57.0,
        "bare_worker_form": "channels-last, fused",
    }
    saturation, _ = report.saturation_rows(results)
    assert saturation["holds"] and abs(saturation["value"] - 51.0 / 46.0) < 1e-9
    assert "c=64 (hey)" in saturation["detail"] and "(channels-last, fused, 57.0 img/s): 0.89x" in saturation["detail"]
    results["litserve"]["points"][2]["inferq_per_s"] = 41.0
    results["litserve"]["points"][3]["inferq_per_s"] = 40.0
    saturation, _ = report.saturation_rows(results)
    assert not saturation["holds"] and abs(saturation["value"] - 41.0 / 46.0) < 1e-9  # the better of c=16 and 64
