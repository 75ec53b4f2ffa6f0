"""The feed's rows (bench/feed.py, bench/feedrows.py) and its profile's readers (bench/feedprofile.py): what each
row reads from a run's figures, when it holds, and how a Redis SLOWLOG and py-spy's stacks are summed up."""

from __future__ import annotations

from typing import Any

import pytest

from bench import cpu, feedprofile, feedrows, report
from bench.feed import best, forward_ns


def _round(redis_submit: float, redis_drain: float, worker: float, forward: float, per_s: float) -> dict[str, Any]:
    threads = {"MainThread": forward, "inferq-prefetch": worker - forward}
    return {
        "jobs": 1000,
        "payload_bytes": 33_986,
        "submit": {
            "redis": {"cpu_us": redis_submit, "commands": {"evalsha": {"calls": 1.0, "us": 20.0}}},
            "api_us": 300,
        },
        "redis": {"cpu_us": redis_drain, "commands": {"eval": {"calls": 0.03, "us": 50.0}}},
        "worker": {
            "processes": [{"comm": "python3", "total_us": worker, "exited_threads_us": 0, "threads_us": threads}]
        },
        "worker_us": worker,
        "forward_us": forward,
        "redis_us": redis_submit + redis_drain,
        "span": {"steady_per_s": per_s},
        "worker_cores": 0.5,
    }


def _feed(**scenarios: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "feed": {
            "rows": ["redis_single", "worker_cpu", "sim_device", "host_capacity", "text_cpu"],
            "rounds": 2,
            "clients": 32,
            "loadgen": "python",
            "submit_s": 3.0,
            "worker_env": {"INFERQ_OVERLAP": "on"},
            "forward": "thread:MainThread",
            "sim_rates": {"sim1000": 1000, "sim2000": 2000},
            "load_average": {"before": [2.0, 2.0, 2.0], "after": [3.0, 2.0, 2.0]},
            "host_loop": {"before": 800.0, "after": 820.0},
            "scenarios": {name: {"rounds": rounds, "best": best(rounds)} for name, rounds in scenarios.items()},
        }
    }


def test_each_figure_keeps_its_best_round() -> None:
    got = best([_round(40, 60, 900, 120, 700), _round(35, 70, 950, 110, 800)])
    assert got["redis_us"] == 100  # the best round's sum, not the sum of each part's best (95)
    assert got["redis_submit_us"] == 40 and got["redis_drain_us"] == 60  # that round's parts
    assert got["worker_us"] == 900 and got["forward_us"] == 110 and got["steady_per_s"] == 800
    assert got["worker_redis_us"] == 1000


def test_the_rows_read_their_scenarios_and_say_whether_they_hold() -> None:
    results = _feed(
        digits=[_round(33, 66, 140, 55, 4000)],
        text=[_round(10, 25, 80, 30, 4000)],
        jpeg=[_round(30, 45, 590, 140, 1300)],
        noop=[_round(30, 60, 26, 20, 6000)],
        sim1000=[_round(100, 140, 900, 150, 960)],
        sim2000=[_round(100, 140, 900, 150, 1600)],
    )
    rows = {row["name"]: row for row in feedrows.rows(results)}
    assert list(rows) == [
        "feed_redis_small",
        "feed_redis_jpeg",
        "feed_worker_noop",
        "feed_worker_cnn",
        "feed_worker_forward",
        "feed_sim_1000",
        "feed_sim_2000",
        "feed_host",
        "feed_text",
    ]
    assert rows["feed_redis_small"]["value"] == 99 and rows["feed_redis_small"]["holds"] is False  # the worse of two
    assert "digit PNG 99.0 us (submit 33.0 + drain 66.0); langid text 35.0 us" in rows["feed_redis_small"]["detail"]
    assert rows["feed_redis_jpeg"]["holds"] is True and "a 33,986-byte JPEG" in rows["feed_redis_jpeg"]["detail"]
    assert rows["feed_worker_noop"]["holds"] is False and rows["feed_worker_cnn"]["holds"] is True
    assert "python3 590: inferq-prefetch 450, MainThread 140" in rows["feed_worker_cnn"]["detail"]
    assert rows["feed_worker_forward"]["value"] == 140 and rows["feed_worker_forward"]["holds"] is True
    assert "in thread:MainThread (the whole process it runs in: 590 us)" in rows["feed_worker_forward"]["detail"]
    assert rows["feed_sim_1000"]["value"] == pytest.approx(0.96) and rows["feed_sim_1000"]["holds"] is True
    assert "960 of 1000 img/s, the worker on 0.50 cores" in rows["feed_sim_1000"]["detail"]
    assert rows["feed_sim_2000"]["value"] == pytest.approx(0.8) and rows["feed_sim_2000"]["holds"] is False
    assert rows["feed_host"]["value"] == pytest.approx(1300 / 820) and rows["feed_host"]["holds"] is True
    assert rows["feed_text"]["value"] == 115 and rows["feed_text"]["holds"] is True  # worker 80 + Redis 35


def test_a_run_of_one_row_shows_that_row_only() -> None:
    results = _feed(sim1000=[_round(100, 140, 900, 150, 700)])
    results["feed"]["rows"] = ["sim_device"]
    assert [row["name"] for row in feedrows.rows(results)] == ["feed_sim_1000"]
    assert feedrows.rows({}) == []


def test_make_bench_shows_the_feed_rows_in_its_table_and_the_end_to_end_row_even_without_the_peer() -> None:
    results = _feed(noop=[_round(30, 60, 26, 20, 6000)])
    results["feed"]["rows"] = ["worker_cpu"]
    noop = {"closed": [{"throughput_per_s": 1300.0, "limited_by_generator": False}]}
    results["systems"] = {"inferq": {"noop": noop}}
    rows = {row["name"]: row for row in report.targets(results)}
    assert rows["feed_worker_noop"]["holds"] is False
    assert rows["e2e_noop"]["holds"] is None and "plain-RQ peer did not run" in rows["e2e_noop"]["detail"]


def test_where_the_forward_runs_is_a_thread_by_name_or_processes_by_name() -> None:
    used = cpu.TreeUsage(
        1.0,
        [
            cpu.ProcessUsage(10, "python3", 900, {"MainThread": 100, "inferq-prefetch": 800}),
            cpu.ProcessUsage(11, "inferq-model", 300, {"MainThread": 300}),
            cpu.ProcessUsage(12, "inferq-model", 50, {"MainThread": 50}),
        ],
    )
    assert forward_ns(used, "thread:MainThread") == 100  # the worker process's own
    assert forward_ns(used, "thread:inferq-prefetch") == 800
    assert forward_ns(used, "process:inferq-model") == 350
    with pytest.raises(ValueError, match="thread:NAME or process:COMM"):
        forward_ns(used, "MainThread")


def test_the_slowlog_is_summed_by_script_with_the_commands_each_ran() -> None:
    names = {"abc123": "enqueue"}
    chronological = [
        [1, 0, 2, [b"EVALSHA", b"abc123", b"3"], b"127.0.0.1:5000", b""],
        [2, 0, 1, [b"MULTI"], b"127.0.0.1:5001", b""],
        [3, 0, 3, [b"HMGET", b"rq:job:a", b"status"], b"?:0", b""],
        [4, 0, 3, [b"HMGET", b"rq:job:b", b"status"], b"?:0", b""],
        [5, 0, 1, [b"EXPIRE", b"rq:job:a", b"60"], b"?:0", b""],
        [6, 0, 30, [b"EVAL", b"-- inferq:finish\nlocal FIXED", b"2"], b"127.0.0.1:5001", b""],
        [7, 0, 4, [b"GET", b"input:a"], b"127.0.0.1:5001", b""],
        [8, 0, 2, [b"SET", b"x", b"1"], b"?:0", b""],
        [9, 0, 6, [b"EVALSHA", b"abc123", b"3"], b"127.0.0.1:5000", b""],
        [10, 0, 9, [b"CONFIG", b"SET"], b"127.0.0.1:5002", b""],
    ]
    got = feedprofile.summarise_slowlog(chronological[::-1], per=2, names=names)
    assert list(got) == ["EVAL finish", "EVALSHA enqueue", "GET", "MULTI"]  # costliest first
    assert got["EVAL finish"] == {
        "calls": 0.5,
        "us": 15.0,
        "share": 30 / 43,
        "us_per_call": 30.0,
        "inner_per_job": {"HMGET": 1.0, "EXPIRE": 0.5},
    }
    assert got["EVALSHA enqueue"]["calls"] == 1.0 and got["EVALSHA enqueue"]["inner_per_job"] == {"SET": 0.5}
    assert got["GET"]["inner_per_job"] == {}


def test_py_spys_stacks_are_summed_by_thread_and_function() -> None:
    collapsed = "\n".join(
        [
            'process 7:"python -m inferq worker";thread (8): MainThread;work (rq/worker.py:1);'
            "run_prepared (inferq/workers/running.py:2) 6",
            'process 7:"python -m inferq worker";thread (9): inferq-prefetch;_run (prefetch.py:3);load (PIL:4) 3',
            'process 7:"python -m inferq worker";thread (10): inferq-prefetch;_run (prefetch.py:3) 1',
            "not a stack line",
        ]
    )
    got = feedprofile.summarise_stacks(collapsed)
    assert got["samples"] == 10
    # Threads by name: a prefetch thread per batch is one line.
    assert got["threads"] == [("MainThread", 0.6), ("inferq-prefetch", 0.4)]
    assert got["self"] == [
        ("run_prepared (inferq/workers/running.py:2)", 0.6),
        ("load (PIL:4)", 0.3),
        ("_run (prefetch.py:3)", 0.1),
    ]
    assert dict(got["inclusive"])["_run (prefetch.py:3)"] == 0.4
    assert got["inferq_inclusive"] == [("run_prepared (inferq/workers/running.py:2)", 0.6)]  # inferq's own only


def test_the_bulk_upload_row_reads_the_api_cpu_per_line() -> None:
    results = _feed()
    results["feed"]["rows"] = ["bulk_upload"]
    uploads = [{"items": 256, "bytes": 11_611_538, "api_us": api_us, "redis_us": 20.0} for api_us in (61.0, 48.5)]
    results["feed"]["bulk_upload"] = {"rounds": uploads, "best": {"api_us": 48.5, "redis_us": 20.0}}
    (row,) = feedrows.rows(results)
    assert row["name"] == "feed_bulk_upload" and row["value"] == 48.5 and row["holds"] is True
    assert "48.5 us/item (Redis 20.0); 256 lines an upload, best of 2" in row["detail"]
