"""`inferq submit` and `inferq models` as a user types them: JSON and text inputs, and one readable line on errors."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.stack import ROOT, Stack, new_stack, serving

pytestmark = pytest.mark.e2e
NOWHERE = "http://127.0.0.1:9"  # the discard port: nothing listens there


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "inferq", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=90
    )


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """The API, a tensor model's worker and the text demo's, as real processes."""
    stack = new_stack(tmp_path_factory.mktemp("cli"))
    shutil.copytree(ROOT / "models" / "langid", stack.models_dir / "langid")
    with serving(stack) as running:
        running.start_api()
        running.start_worker("slow")
        running.start_worker("langid")
        running.wait_for_worker("slow")
        running.wait_for_worker("langid")
        yield running


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
