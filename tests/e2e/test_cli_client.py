"""`inferq submit`, `models` and `batch` as a user types them, through the SDK: the same answers as the SDK's own
calls for image, tensor, text and json models, and one readable line on errors."""

from __future__ import annotations

import ast
import json
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from inferq.client import Client
from tests.support.models import ROOT
from tests.support.stack import Stack, new_stack, serving
from tests.support.waiting import wait_until

NOWHERE = "http://127.0.0.1:9"  # the discard port: nothing listens there
SAMPLES = ROOT / "samples"
RAGGED = {"handler": "tests.support.builders:Ragged", "weights": "none", "input": {"kind": "json"}}
IDLE = {"handler": "tests.support.echo:SlowEcho", "weights": "none", "input": {"kind": "tensor", "shape": [2]}}


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "inferq", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=90
    )


SERVED = ("digits", "slow", "langid", "ragged")


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """The API and one worker for an image, a tensor, a text and a json model; 'idle' has no worker."""
    stack = new_stack(tmp_path_factory.mktemp("cli"), INFERQ_TEST_SLOW_S="0")
    shutil.copytree(ROOT / "models" / "langid", stack.models_dir / "langid")
    for name, config in (("ragged", RAGGED), ("idle", IDLE)):
        (stack.models_dir / name).mkdir()
        (stack.models_dir / name / "config.json").write_text(json.dumps(config))
    with serving(stack) as running:
        running.start_api()
        running.start_worker(*SERVED)
        for model in SERVED:
            running.wait_for_worker(model)
        yield running


@pytest.fixture
def client(served: Stack) -> Iterator[Client]:
    with Client(served.base) as connected:
        yield connected


def _one_result(done: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    assert done.returncode == 0, done.stderr
    # Nothing on stderr: no httpx INFO line per request.
    assert done.stderr == ""
    (line,) = done.stdout.splitlines()
    answer: dict[str, Any] = json.loads(line)
    return answer


def test_submit_json_a_json_file_and_text(served: Stack, tmp_path: Path) -> None:
    api = ["--api", served.base, "--wait", "30"]
    answer = _one_result(_cli("submit", "slow", "--json", '{"inputs": [1, 2]}', *api))
    assert (answer["input"], answer["http_status"], answer["status"]) == ("--json", 200, "finished")
    assert answer["result"] == {"output": [1.0, 2.0]}
    body = tmp_path / "body.json"
    body.write_text('{"inputs": [3, 4]}')
    answer = _one_result(_cli("submit", "slow", str(body), *api))
    assert (answer["input"], answer["result"]) == (str(body), {"output": [3.0, 4.0]})
    answer = _one_result(_cli("submit", "langid", "--text", "Der Hund schläft heute im Garten unter dem Baum", *api))
    assert answer["status"] == "finished" and answer["result"]["label"] == "de"
    # The API's refusal is the answer, not a traceback: one JSON line and exit status 1.
    done = _cli("submit", "slow", "--json", '{"inputs": "not numbers"}', *api)
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert json.loads(done.stdout)["http_status"] == 422


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["submit", "digits", "/nonexistent.png"], "inferq: cannot read /nonexistent.png: No such file or directory"),
        (["submit", "slow", "--json", "{inputs"], "inferq: --json is not JSON: Expecting property name enclosed"),
        (["submit", "slow", "--json", "[1, 2]"], 'inferq: --json must be a JSON object with "inputs"'),
        (["submit", "slow"], "inferq: nothing to submit: give FILE..., --json BODY or --text TEXT"),
        (["submit", "slow", "--json", '{"inputs": [1, 2], "colour": 1}'], "inferq: --json has unknown fields: colour"),
        (["submit", "slow", "--text", "hi"], f"inferq: cannot reach the API at {NOWHERE}: "),
        (["models"], f"inferq: cannot reach the API at {NOWHERE}: "),
    ],
)
def test_errors_are_one_readable_line(args: list[str], message: str) -> None:
    done = _cli(*args, "--api", NOWHERE)
    assert done.returncode == 2
    assert done.stdout == ""
    (line,) = done.stderr.splitlines()
    assert line.startswith(message), line


def _imports(module: str) -> set[str]:
    tree = ast.parse((ROOT / "inferq" / f"{module}.py").read_text())
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


def test_the_cli_talks_to_the_api_only_through_the_sdk() -> None:
    http = ("httpx", "requests", "urllib3", "aiohttp", "http.client", "urllib.request")
    for module in ("cli", "bulk"):
        imported = _imports(module)
        assert not {name for name in imported if name.split(".")[0] in http or name in http}, module
        assert "inferq.client" in imported, module


@pytest.mark.parametrize(
    ("model", "cli_input", "sdk_input"),
    [
        ("digits", [str(SAMPLES / "digit.png")], {"image": SAMPLES / "digit.png"}),
        ("slow", ["--json", '{"inputs": [1.5, -2]}'], {"inputs": [1.5, -2]}),
        ("langid", ["--text", "Les enfants jouent dans le jardin"], {"inputs": "Les enfants jouent dans le jardin"}),
        ("ragged", ["--json", '{"inputs": {"values": [0.1, 0.7, 2]}}'], {"inputs": {"values": [0.1, 0.7, 2]}}),
    ],
)
def test_submit_answers_what_the_sdk_answers(
    served: Stack, client: Client, model: str, cli_input: list[str], sdk_input: dict[str, Any]
) -> None:
    answer = _one_result(_cli("submit", model, *cli_input, "--api", served.base, "--wait", "30"))
    job = client.run(model, timeout=30, **sdk_input)
    assert (answer.pop("input"), answer.pop("http_status"), answer["status"]) == (cli_input[0], 200, "finished")
    assert answer["result"] == job.result is not None
    # The line is the job's view as the SDK reads it, field for field (expires_at is computed at each read).
    view = client.get(answer["id"]).to_dict()
    assert {**answer, "expires_at": None} == {**view, "expires_at": None}


def test_failed_jobs_and_refused_inputs_are_lines_and_the_rest_still_go(served: Stack, tmp_path: Path) -> None:
    poison, good = tmp_path / "poison.json", tmp_path / "good.json"
    poison.write_text('{"inputs": [666, 1]}')
    good.write_text('{"inputs": [5, 6], "result_ttl": 60}')
    done = _cli(
        "submit", "slow", str(poison), str(good), "--json", '{"inputs": [1]}', "--api", served.base, "--wait", "30"
    )
    assert done.returncode == 1 and done.stderr == ""
    lines = [json.loads(line) for line in done.stdout.splitlines()]
    assert [(line["input"], line["http_status"]) for line in lines] == [
        (str(poison), 200),
        (str(good), 200),
        ("--json", 422),
    ]
    assert lines[0]["status"] == "failed" and "poison" in lines[0]["error"]
    assert lines[1]["status"] == "finished" and lines[1]["result"] == {"output": [5.0, 6.0]}
    assert lines[2]["error"]["code"] == "invalid_input"


def test_a_wait_that_runs_out_prints_the_queued_job_in_its_lane(served: Stack, client: Client) -> None:
    args = ["submit", "idle", "--json", '{"inputs": [1, 2]}', "--priority", "bulk", "--api", served.base]
    waited = _one_result(_cli(*args, "--wait", "0.5"))
    assert (waited["http_status"], waited["status"], waited["result"]) == (202, "queued", None)
    queued = _one_result(_cli(*args))
    assert (queued["http_status"], queued["status"]) == (202, "queued")
    # An enqueued job shows when it was queued: the submit's answer carries it (it printed null).
    assert waited["enqueued_at"] is not None and queued["enqueued_at"] == queued["created_at"] is not None
    assert queued["urls"]["self"] == f"{served.base}/v1/jobs/{queued['id']}"
    assert client.model("idle").queue_lengths == {"interactive": 0, "bulk": 2}
    for job_id in (waited["id"], queued["id"]):
        client.cancel(job_id)


def test_models_lists_what_the_sdk_lists(served: Stack, client: Client) -> None:
    done = _cli("models", "--api", served.base)
    assert done.returncode == 0 and done.stderr == ""
    rows = {line.split()[0]: line for line in done.stdout.splitlines()}
    listing = client.models()
    assert set(rows) == {model.name for model in listing.models}
    for model in listing.models:
        assert f"max_batch={model.max_batch} " in rows[model.name]
        assert rows[model.name].endswith(f"workers={model.workers}")
    assert rows["digits"].endswith("workers=1") and rows["idle"].endswith("workers=0")


def test_an_unknown_model_is_one_line_and_exit_2(served: Stack) -> None:
    for args in (["submit", "nope", "--text", "hi"], ["submit", "nope", str(SAMPLES / "digit.png"), "--wait", "5"]):
        done = _cli(*args, "--api", served.base)
        assert (done.returncode, done.stdout) == (2, ""), done.stderr
        (line,) = done.stderr.splitlines()
        assert line.startswith(f"inferq: {served.base} answered 404 not_found: "), line


def test_api_keys_go_with_every_command_and_a_refused_one_is_one_line(tmp_path: Path) -> None:
    stack = new_stack(tmp_path, INFERQ_API_KEYS="key-1")
    source = tmp_path / "items.jsonl"
    source.write_text('{"custom_id": "a", "inputs": [1, 2]}\n')
    with serving(stack) as running:
        running.start_api()
        api = ["--api", running.base]
        for args in (["models"], ["submit", "slow", "--json", '{"inputs": [1, 2]}']):
            done = _cli(*args, *api)
            assert (done.returncode, done.stdout) == (2, ""), done.stderr
            (line,) = done.stderr.splitlines()
            assert line.startswith(f"inferq: {running.base} answered 401 unauthorized: "), line
        refused = _cli("batch", "slow", str(source), "--out", str(tmp_path / "out.jsonl"), *api)
        assert refused.returncode == 1 and "401 unauthorized" in refused.stderr, refused.stderr
        listed = _cli("models", *api, "--api-key", "key-1")
        assert listed.returncode == 0 and "slow" in listed.stdout, listed.stderr
        queued = _one_result(_cli("submit", "slow", "--json", '{"inputs": [1, 2]}', *api, "--api-key", "key-1"))
        assert (queued["http_status"], queued["status"]) == (202, "queued")


def _batch_answers(base: str) -> dict[str, float]:
    """The API's answers to uploads by status, as /metrics counts them (every API process adds its own each second)."""
    text = httpx.get(f"{base}/metrics", timeout=10).text
    return {
        sample.labels["status"]: sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "inferq_http_requests_total" and sample.labels["route"] == "/v1/models/{model}/batches"
    }


def test_batch_stops_at_once_on_an_upload_its_quota_never_holds_and_a_rollout_needs_an_operators_key(
    tmp_path: Path,
) -> None:
    """An upload over the tenant's whole bulk_lines quota was a 429 that `inferq batch` retried for 40 s; and any
    tenant's key could set a model's rollout for every tenant."""
    tenants = [
        {"name": "acme", "key": "key-acme", "quotas": {"bulk_lines": 3}},
        {"name": "ops", "key": "key-ops", "operator": True},
    ]
    stack = new_stack(tmp_path, INFERQ_TENANTS=json.dumps(tenants))
    source = tmp_path / "items.jsonl"
    source.write_text("".join(json.dumps({"custom_id": f"i{n}", "inputs": [n, n]}) + "\n" for n in range(5)))
    with serving(stack) as running:
        running.start_api()
        api = ["--api", running.base]
        done = _cli("batch", "slow", str(source), "--out", str(tmp_path / "out.jsonl"), *api, "--api-key", "key-acme")
        assert (done.returncode, done.stdout) == (1, ""), done.stderr
        (line,) = done.stderr.splitlines()
        assert line == (
            "inferq batch: 413 payload_too_large: the upload holds more than 3 items, tenant"
            " acme's whole bulk_lines quota (its upload lines that may wait at once): it can never be queued; split it"
        )
        wait_until(lambda: _batch_answers(running.base), 30, "the API's request counts in Redis")
        assert _batch_answers(running.base) == {"413": 1.0}  # one upload, never retried

        rollout = ["models", "rollout", "slow", "1=100", *api]
        refused = _cli(*rollout, "--api-key", "key-acme")
        assert (refused.returncode, refused.stdout) == (2, ""), refused.stderr
        (line,) = refused.stderr.splitlines()
        assert line.startswith(f"inferq: {running.base} answered 403 forbidden: tenant acme may not do this: "), line
        assert running.redis().exists("inferq:rollout:slow") == 0
        taken = _cli(*rollout, "--api-key", "key-ops")
        assert taken.returncode == 0 and "traffic 1=100" in taken.stdout, taken.stderr
