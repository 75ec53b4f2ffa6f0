"""Bulk batches and lanes through real processes: upload, kill -9 mid-bulk, interactive work during a drain."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
from rq.serializers import JSONSerializer
from rq.suspension import resume, suspend

from inferq.api.routers.batches import RESULTS_OFFSET_MAX
from inferq.shared import keys
from inferq.shared.redis_server import RedisServer
from inferq.shared.rqjson import JSONJob
from tests.support.echo import POISON
from tests.support.models import ROOT, train_script
from tests.support.stack import Stack, new_stack, serving
from tests.support.waiting import wait_until


@pytest.fixture(scope="module")
def bulk_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """An API and Redis only: each test starts and stops its own workers."""
    with serving(new_stack(tmp_path_factory.mktemp("bulk"))) as running:
        running.start_api()
        yield running


@pytest.fixture(autouse=True)
def _stop_workers(bulk_stack: Stack) -> Iterator[None]:
    api, api_log = bulk_stack.procs[:1], bulk_stack.logs[:1]
    yield
    for proc in bulk_stack.procs[1:]:
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
    bulk_stack.procs[:], bulk_stack.logs[:] = api, api_log
    client = bulk_stack.redis()
    for key in client.keys("rq:worker:*"):
        client.delete(key)
    client.srem("rq:workers", *client.smembers("rq:workers") or [b"-"])
    client.close()


def jsonl(lines: list[Any]) -> bytes:
    return b"".join((line if isinstance(line, bytes) else json.dumps(line).encode()) + b"\n" for line in lines)


def upload(stack: Stack, model: str, body: bytes, **params: Any) -> dict[str, Any]:
    response = httpx.post(
        f"{stack.base}/v1/models/{model}/batches",
        content=body,
        params=params,
        headers={"content-type": "application/jsonl"},
        timeout=30,
    )
    assert response.status_code == 202, response.text
    return response.json()


def batch(stack: Stack, batch_id: str) -> dict[str, Any]:
    response = httpx.get(f"{stack.base}/v1/batches/{batch_id}")
    assert response.status_code == 200, response.text
    return response.json()


def results(stack: Stack, batch_id: str, **params: Any) -> list[dict[str, Any]]:
    response = httpx.get(f"{stack.base}/v1/batches/{batch_id}/results", params=params)
    assert response.status_code == 200 and response.headers["content-type"].startswith("application/jsonl")
    return [json.loads(line) for line in response.text.splitlines()]


def items(count: int, prefix: str = "item") -> list[dict[str, Any]]:
    return [{"custom_id": f"{prefix}-{i}", "inputs": [i, i]} for i in range(count)]


def test_an_upload_runs_every_item_and_a_bad_line_fails_alone(bulk_stack: Stack) -> None:
    lines: list[Any] = [*items(10), b"{not json", {"custom_id": "wrong-shape", "inputs": [1, 2, 3]}]
    lines.append({"custom_id": "poisoned", "inputs": [POISON, 0]})
    accepted = upload(bulk_stack, "slow", jsonl(lines))
    assert accepted["status"] == "queued" and accepted["total"] == 12 and accepted["refused_count"] == 2
    assert [(r["line"], r["custom_id"]) for r in accepted["refused"]] == [(11, None), (12, "wrong-shape")]
    assert accepted["refused"][1]["error"] == "line 12: inputs: expected an array of length 2, got length 3"
    bulk_stack.run_burst("slow")
    view = batch(bulk_stack, accepted["id"])
    assert view["status"] == "finished" and view["eta_s"] == 0.0
    assert view["counts"] == {"total": 12, "queued": 0, "running": 0, "finished": 10, "failed": 2, "canceled": 0}
    lines_out = results(bulk_stack, accepted["id"])
    assert Counter(line["custom_id"] for line in lines_out) == Counter(
        [f"item-{i}" for i in range(10)] + ["wrong-shape", "poisoned"]
    )
    assert {line["custom_id"]: line.get("result") for line in lines_out}["item-7"] == {"output": [7.0, 7.0]}
    failed = results(bulk_stack, accepted["id"], status="failed")
    assert sorted(line["custom_id"] for line in failed) == ["poisoned", "wrong-shape"]


def test_an_upload_with_no_valid_line_is_refused_whole(bulk_stack: Stack) -> None:
    response = httpx.post(
        f"{bulk_stack.base}/v1/models/slow/batches", content=b"[1]\n{}\n", headers={"content-type": "application/jsonl"}
    )
    assert response.status_code == 422
    assert "line 1" in response.json()["error"]["message"]


def test_a_chunk_is_no_job_to_clients_and_its_batch_still_ends(bulk_stack: Stack) -> None:
    """A chunk's id is predictable (``batch-<batch id>-<n>``): every job route answers 404 for it."""
    accepted = upload(bulk_stack, "slow", jsonl(items(3, "chunked")))
    job_url = f"{bulk_stack.base}/v1/jobs/{keys.chunk_id(accepted['id'], 0)}"
    # The cancel before the events: on a chunk left queued the event stream would not end.
    for method, url in (("GET", job_url), ("GET", f"{job_url}?wait=1"), ("POST", f"{job_url}/cancel")):
        response = httpx.request(method, url, timeout=10)
        assert response.status_code == 404, (method, url, response.text)
        assert response.json()["error"]["code"] == "not_found"
    with httpx.stream("GET", f"{job_url}/events", timeout=10) as events:
        assert events.status_code == 404 and events.read().startswith(b'{"error":')
    assert batch(bulk_stack, accepted["id"])["counts"]["queued"] == 3
    bulk_stack.run_burst("slow")
    view = batch(bulk_stack, accepted["id"])
    assert (view["status"], view["counts"]["finished"]) == ("finished", 3)
    lines = results(bulk_stack, accepted["id"])
    assert sorted(line["custom_id"] for line in lines) == [f"chunked-{i}" for i in range(3)]


def test_a_results_offset_past_any_batch_is_refused_before_the_stream_starts(bulk_stack: Stack) -> None:
    accepted = upload(bulk_stack, "slow", jsonl(items(2, "offset")))
    url = f"{bulk_stack.base}/v1/batches/{accepted['id']}/results"
    for offset in (RESULTS_OFFSET_MAX + 1, 2**63, 2**64):
        response = httpx.get(url, params={"offset": offset})
        assert response.status_code == 422, (offset, response.text)
        assert response.json()["error"]["code"] == "invalid_request"
    response = httpx.get(url, params={"offset": RESULTS_OFFSET_MAX})
    assert (response.status_code, response.text) == (200, "")


def test_kill_9_mid_bulk_ends_every_custom_id_exactly_once(bulk_stack: Stack) -> None:
    accepted = upload(bulk_stack, "slow", jsonl(items(24)))
    doomed = bulk_stack.start_worker("slow", name="doomed", env={"INFERQ_TEST_SLOW_S": "3"})
    wait_until(lambda: batch(bulk_stack, accepted["id"])["counts"]["running"] > 0, 30, "a chunk to start")
    doomed.send_signal(signal.SIGKILL)
    doomed.wait()
    bulk_stack.start_worker("slow", name="survivor")
    wait_until(lambda: batch(bulk_stack, accepted["id"])["status"] == "finished", 90, "the batch to end")
    lines = results(bulk_stack, accepted["id"])
    assert sorted(line["custom_id"] for line in lines) == sorted(f"item-{i}" for i in range(24))
    assert {line["status"] for line in lines} == {"finished"}


def test_a_two_model_worker_with_both_lanes_loses_nothing_under_kill_9(bulk_stack: Stack) -> None:
    accepted = upload(bulk_stack, "slow", jsonl(items(16, "bulk")))
    singles = []
    for model in ("slow", "fragile"):
        for i in range(3):
            response = httpx.post(f"{bulk_stack.base}/v1/models/{model}/jobs", json={"inputs": [i, i]})
            assert response.status_code == 202
            singles.append(response.json()["id"])
    doomed = bulk_stack.start_worker("slow", "fragile", name="doomed2", env={"INFERQ_TEST_SLOW_S": "3"})
    wait_until(lambda: batch(bulk_stack, accepted["id"])["counts"]["running"] > 0, 60, "a chunk to start")
    doomed.send_signal(signal.SIGKILL)
    doomed.wait()
    bulk_stack.start_worker("slow", "fragile", name="survivor2")
    wait_until(lambda: batch(bulk_stack, accepted["id"])["status"] == "finished", 90, "the batch to end")
    wait_until(
        lambda: {httpx.get(f"{bulk_stack.base}/v1/jobs/{i}").json()["status"] for i in singles} == {"finished"},
        60,
        "every single job to finish",
    )
    assert sorted(line["custom_id"] for line in results(bulk_stack, accepted["id"])) == sorted(
        f"bulk-{i}" for i in range(16)
    )


def test_interactive_work_waits_at_most_one_bulk_chunk_during_a_drain(bulk_stack: Stack) -> None:
    accepted = upload(bulk_stack, "slow", jsonl(items(48, "drain")))
    bulk_stack.start_worker("slow", name="drainer", env={"INFERQ_TEST_SLOW_S": "0.3"})
    wait_until(lambda: batch(bulk_stack, accepted["id"])["counts"]["finished"] >= 8, 30, "the drain to be under way")
    response = httpx.post(
        f"{bulk_stack.base}/v1/models/slow/jobs", json={"inputs": [1, 1]}, headers={"Prefer": "wait=30"}, timeout=40
    )
    assert response.status_code == 200 and response.json()["status"] == "finished"
    job = response.json()
    wait_until(lambda: batch(bulk_stack, accepted["id"])["status"] == "finished", 60, "the bulk run to complete")
    client = bulk_stack.redis()
    chunk_starts = []
    for number in range(6):
        chunk = JSONJob.fetch(keys.chunk_id(accepted["id"], number), connection=client, serializer=JSONSerializer)
        chunk_starts.append(chunk.started_at.replace(tzinfo=None))
    client.close()
    enqueued = datetime.fromisoformat(job["enqueued_at"].rstrip("Z"))
    started = datetime.fromisoformat(job["started_at"].rstrip("Z"))
    # Chunks that started while the interactive job waited: none, or one when the bulk share came due.
    assert sum(enqueued < start < started for start in chunk_starts) <= 1


def run_cli(stack: Stack, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "inferq", "batch", *args, "--api", stack.base],
        cwd=ROOT,
        env={**os.environ, **stack.env},
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_the_cli_runs_a_folder_of_images_and_a_rerun_skips_what_is_done(bulk_stack: Stack, tmp_path: Path) -> None:
    train = train_script("digits")
    _, _, images, labels = train.load_split()
    folder = tmp_path / "digits"
    (folder / "nested").mkdir(parents=True)
    for i in range(5):
        (folder / ("nested" if i % 2 else "") / f"{i}.png").write_bytes(train.render_png(images[i]))
    out = tmp_path / "results.jsonl"
    bulk_stack.start_worker("digits", name="digits-bulk")
    done = run_cli(bulk_stack, "digits", str(folder), "--out", str(out))
    assert done.returncode == 0, done.stderr
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    by_id = {line["custom_id"]: line for line in lines}
    assert len(lines) == 5 and set(by_id) == {str(folder / ("nested" if i % 2 else "") / f"{i}.png") for i in range(5)}
    assert {line["status"] for line in lines} == {"finished"}
    paths = [str(folder / ("nested" if i % 2 else "") / f"{i}.png") for i in range(5)]
    correct = sum(by_id[path]["result"]["label"] == str(int(labels[i])) for i, path in enumerate(paths))
    assert correct >= 4
    again = run_cli(bulk_stack, "digits", str(folder), "--out", str(out))
    assert again.returncode == 0 and "nothing to do" in again.stdout
    assert len(out.read_text().splitlines()) == 5


# ``python -m inferq`` with SIGINT raising KeyboardInterrupt, as in a terminal (an ignored SIGINT is inherited).
_WITH_CTRL_C = (
    "import runpy, signal; signal.signal(signal.SIGINT, signal.default_int_handler);"
    " runpy.run_module('inferq', run_name='__main__', alter_sys=True)"
)


@pytest.mark.timeout(600)  # its hang guards, on a loaded machine
def test_ctrl_c_cancels_what_has_not_run_and_keeps_what_finished(bulk_stack: Stack, tmp_path: Path) -> None:
    source = tmp_path / "items.jsonl"
    source.write_bytes(jsonl(items(40, "cc")))
    out = tmp_path / "out.jsonl"
    bulk_stack.start_worker("slow", name="slow-cc", env={"INFERQ_TEST_SLOW_S": "1"})
    # The CLI as a terminal's Ctrl-C finds it, whatever this process inherited: started in the background of a
    # script, the whole suite (and every child) had SIGINT ignored, and the CLI never saw it.
    command = [sys.executable, "-c", _WITH_CTRL_C, "batch", "slow", str(source), "--out", str(out)]
    with subprocess.Popen(
        [*command, "--api", bulk_stack.base],
        cwd=ROOT,
        env={**os.environ, **bulk_stack.env},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    ) as cli:
        # Hang guards, not timings: on a loaded machine the worker's start alone (torch's import) has taken a minute.
        wait_until(lambda: out.exists() and len(out.read_text().splitlines()) >= 8, 240, "the first chunk's lines")
        # The worker suspended (RQ's own switch: it ends the chunk it runs, starts at most one more within its check's
        # second), so some chunks surely wait when the cancel comes, however slowly a loaded machine runs the CLI.
        client = bulk_stack.redis()
        suspend(client)
        try:
            cli.send_signal(signal.SIGINT)
            _, stderr = cli.communicate(timeout=180)
            assert cli.returncode == 130, stderr
            assert "canceled" in stderr
            (batch_key,) = [
                k for k in client.keys("inferq:batch:*") if k.count(b":") == 2 and client.hget(k, "total") == b"40"
            ]
            view = batch(bulk_stack, batch_key.decode().rsplit(":", 1)[1])
            wait_until(lambda: batch(bulk_stack, view["id"])["status"] == "canceled", 120, "the batch to end canceled")
        finally:
            resume(client)
            client.close()
    counts = batch(bulk_stack, view["id"])["counts"]
    assert counts["canceled"] > 0 and counts["finished"] + counts["canceled"] == 40
    written = [json.loads(line)["custom_id"] for line in out.read_text().splitlines()]
    assert len(written) == len(set(written)) >= 8


def test_priority_bulk_puts_a_single_job_in_the_bulk_lane(bulk_stack: Stack) -> None:
    body = {"inputs": [1, 2], "priority": "bulk"}
    response = httpx.post(f"{bulk_stack.base}/v1/models/slow/jobs", json=body)
    assert response.status_code == 202, response.text
    job_id = response.json()["id"]
    client = bulk_stack.redis()
    assert job_id.encode() in client.lrange("rq:queue:inferq.slow.bulk", 0, -1)
    client.close()
    model = httpx.get(f"{bulk_stack.base}/v1/models/slow").json()
    assert model["queue_lengths"] == {"interactive": 0, "bulk": 1} and model["queue_length"] == 1
    refused = httpx.post(f"{bulk_stack.base}/v1/models/slow/jobs", json={"inputs": [1, 2], "priority": "urgent"})
    assert refused.status_code == 422
    form = httpx.post(
        f"{bulk_stack.base}/v1/models/digits/jobs",
        files={"file": ("d.png", (ROOT / "samples" / "digit.png").read_bytes(), "image/png")},
        data={"priority": "bulk"},
    )
    assert form.status_code == 202, form.text
    bulk_stack.run_burst("slow", "digits")
    assert httpx.get(f"{bulk_stack.base}/v1/jobs/{job_id}").json()["status"] == "finished"
    assert httpx.get(f"{bulk_stack.base}/v1/jobs/{form.json()['id']}").json()["result"]["label"] == "7"


def test_a_redis_restart_mid_bulk_ends_every_custom_id_exactly_once(tmp_path: Path) -> None:
    """Redis shut down and started again (AOF) while a bulk batch drains: it resumes, nothing lost or doubled."""
    stack = new_stack(tmp_path, appendonly=True)
    with serving(stack):
        stack.start_api()
        accepted = upload(stack, "slow", jsonl(items(40)))
        stack.start_worker("slow", env={"INFERQ_TEST_SLOW_S": "0.5"})
        wait_until(lambda: batch(stack, accepted["id"])["counts"]["finished"] >= 8, 60, "chunks to finish")
        port = stack.redis_server.port
        stack.redis_server.stop()  # SHUTDOWN: the AOF holds every acknowledged write
        time.sleep(1)  # the worker and the API see Redis gone, and retry
        stack.redis_server = RedisServer(tmp_path / "redis", port=port, appendonly=True)
        stack.redis_server.start()

        def ended() -> bool:
            try:
                return batch(stack, accepted["id"])["status"] == "finished"
            except (AssertionError, httpx.HTTPError):
                return False  # 503 while the API reconnects

        wait_until(ended, 120, "the batch to end")
        lines = results(stack, accepted["id"])
    assert Counter(line["custom_id"] for line in lines) == Counter(f"item-{i}" for i in range(40))
    assert {line["status"] for line in lines} == {"finished"}
    assert [line["result"] for line in sorted(lines, key=lambda x: int(x["custom_id"].split("-")[1]))] == [
        {"output": [float(i), float(i)]} for i in range(40)
    ]
