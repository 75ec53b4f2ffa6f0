"""The examples of the README and of the docs site's pages run as written against a real stack
(tests/support/stack.py).

Every ```bash command and ```python snippet of the README, then of every page of mkdocs.yml's nav in its order,
is an example here, in each document's order: its curl lines, `inferq` commands, the SDK and Triton snippets,
`rq info`, and the model folders that docs/serving.md writes (the stack serves them). Only the API's address,
the Redis URL, `.venv/bin/` and the placeholder ids (`oA1c…`: the id an example answer shows) are changed. An
example a test cannot run is skipped with its reason; one that is neither run nor given a reason fails, so a
new example is run here or says why not. Where a document shows an example's answer, every field it names must
be in the real answer.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.support.docs import Example, bash_commands, blocks
from tests.support.models import ROOT
from tests.support.stack import Stack, new_stack, serving
from tests.support.waiting import wait_until

pytestmark = pytest.mark.timeout(300)
# The site's pages that are repository files outside docs/ (docs/hooks.py's ROOT_PAGES).
ROOT_PAGES = {"index.md": "README.md", "contributing.md": "CONTRIBUTING.md"}
BIN = Path(sys.executable).parent
README_API = "127.0.0.1:8000"
# Ids the documents write as a few characters and an ellipsis, bound to the id its example answer shows.
PLACEHOLDER = re.compile(r"\b[A-Za-z0-9]{2,8}…")
# Bash commands that are not run, by how they start, and why.
NOT_RUN = (
    ("make setup TORCH_INDEX=", "downloads torch from download.pytorch.org: no network in tests"),
    ("make ", "make builds .venv or starts everything; `make test` runs this suite, as .ci/run does"),
    ("docker ", "needs Docker and the images it pulls"),
    (
        "export ",
        "sets variables for the commands after it: the webhook walk-through (tests/e2e/test_e2e_operators.py runs it)"
        " and the shards of docs/redis.md (tests/e2e/test_e2e_shards.py)",
    ),
    (
        "INFERQ_REDIS_URL=",
        "needs a Sentinel group (tests/e2e/test_e2e_sentinel.py runs rq info -c inferq.rqconfig against one) or Docker",
    ),
    (
        "OTEL_EXPORTER_OTLP_ENDPOINT=",
        "starts inferq exporting traces to a collector: tests/e2e/test_e2e_tracing.py runs inferq up so, against"
        " an OTLP receiver",
    ),
    ("INFERQ_TENANTS=", "starts inferq up with tenants from a file: tests/e2e/test_e2e_tenants.py starts the API so"),
    (".venv/bin/python samples/webhook_receiver.py", "a receiver that runs until stopped (test_e2e_operators.py)"),
    (
        ".venv/bin/rq-dashboard ",
        "a server that runs until stopped: test_e2e_operators.py reads its JSON endpoints, test_e2e_sentinel.py"
        " through a Sentinel group",
    ),
    (".venv/bin/pip install ", "downloads wheels from download.pytorch.org: no network in tests"),
    ("python -m bench.run", "the benchmark: minutes of load (make bench)"),
    ("python -m bench.gpu", "measures a CUDA GPU (tests/e2e/test_bench_gpu.py runs its --dry-run and its refusal)"),
    ("inferq ", "the commands' synopsis, with placeholders for every option"),
    ("mkdir -p models/sentiment", "needs your own save_pretrained folder"),
    ("cat > models/sentiment/", "the config beside your own save_pretrained folder"),
)
RUN = ("curl ", "printf ", ".venv/bin/inferq ", ".venv/bin/rq info ")
# The models the stack's worker serves: the demos, the tensor model docs/serving.md's ONNX snippet writes, and the
# models of its handlers of one's own.
SERVED = ("digits", "langid", "tiny-onnx", "digit-logits", "langid-lower", "loudness")
# A python snippet that is a module the worker imports, saved in the working folder under the name its first line
# gives: "# my_models.py, importable by the worker".
MODULE = re.compile(r"# (\w+\.py), importable by the worker")


def nav_pages(nav: Any) -> Iterator[str]:
    """The pages of mkdocs.yml's nav, in its order."""
    if isinstance(nav, str):
        yield nav
    elif isinstance(nav, list):
        for entry in nav:
            yield from nav_pages(entry)
    elif isinstance(nav, dict):
        for entry in nav.values():
            yield from nav_pages(entry)


def documents() -> list[str]:
    """The README, then every page of the docs site in its nav's order, as paths from the repository's root."""
    nav = yaml.safe_load((ROOT / "mkdocs.yml").read_text())["nav"]
    pages = [ROOT_PAGES.get(page, f"docs/{page}") for page in nav_pages(nav)]
    return ["README.md", *(page for page in pages if page != "README.md")]


def examples() -> list[Example]:
    found = []
    for source in documents():
        for language, start, lines, marked in blocks((ROOT / source).read_text()):
            if language == "bash":
                found += bash_commands(source, start, lines, marked)
            elif language == "python":
                found.append(Example(source, start, "python", "\n".join(lines)))
    return found


UNKNOWN = "unknown"


def reason_not_run(example: Example) -> str | None:
    """Why an example is not run; None for one that is, UNKNOWN for one this file does not know."""
    if example.walk_through:
        return f"a step of a walk-through that {example.walk_through} runs in order under inferq up"
    if example.kind == "python" or example.code.startswith(RUN):
        return None
    return next((reason for prefix, reason in NOT_RUN if example.code.startswith(prefix)), UNKNOWN)


def params() -> list[Any]:
    out = []
    for example in examples():
        reason = reason_not_run(example)
        marks = [pytest.mark.skip(reason=reason)] if reason not in (None, UNKNOWN) else []
        out.append(pytest.param(example, id=example.id, marks=marks))
    return out


def fields_in(value: Any) -> set[str]:
    """Every key of every object in a JSON value."""
    if isinstance(value, dict):
        return set(value) | {name for item in value.values() for name in fields_in(item)}
    if isinstance(value, list):
        return {name for item in value for name in fields_in(item)}
    return set()


def shown_fields(example: Example) -> set[str]:
    """The fields a document's answer of an example names."""
    return set(re.findall(r'"(\w+)":', " ".join(line for line in example.shown if line.startswith(("{", '"')))))


@dataclass
class Readme:
    """The stack the examples run against, and the ids their answers bound to the documents' placeholders."""

    stack: Stack
    work: Path
    env: dict[str, str]
    bound: dict[str, str] = field(default_factory=dict)
    model_snippets: dict[str, subprocess.CompletedProcess[str]] = field(default_factory=dict)

    def adapt(self, code: str) -> str:
        host = self.stack.base.removeprefix("http://")
        code = code.replace(f"http://{README_API}", self.stack.base).replace("localhost:8000", host)
        code = code.replace(README_API, host).replace("redis://127.0.0.1:PORT/0", self.stack.redis_url)
        # The documents' .venv is this interpreter's; inferq itself from this checkout (PYTHONPATH), not an install.
        code = re.sub(r"(?<![\w/.])\.venv/bin/inferq\b", f'"{sys.executable}" -m inferq', code)
        code = re.sub(r"(?<![\w/.])\.venv/bin/", f"{BIN}/", code)
        for placeholder in PLACEHOLDER.findall(code):
            code = code.replace(placeholder, self.resolve(placeholder))
        return code

    def resolve(self, placeholder: str) -> str:
        """The id an earlier example's answer bound to ``placeholder``, running that example if it has not run."""
        if placeholder not in self.bound:
            binder = next(e for e in examples() if f'"id":"{placeholder}"' in " ".join(e.shown))
            run_example(self, binder)
        return self.bound[placeholder]

    def run(self, code: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["bash", "-c", code], cwd=self.work, env=self.env, capture_output=True, text=True, timeout=120
        )

    def wait_for_end(self, object_id: str, kind: str) -> None:
        """Until the job or batch ``object_id`` ended: then a cancel's answer (409) is certain."""
        url = f"{self.stack.base}/v1/{kind}/{object_id}"

        def ended() -> bool:
            status = httpx.get(url, timeout=10).json()["status"]
            return status in ("finished", "failed", "canceled", "expired")

        wait_until(ended, 90, f"{kind} {object_id} to end")


def model_snippets() -> list[tuple[Example, str]]:
    """The python snippets that write a model folder, each with the file it must be saved as (or "")."""
    out = []
    for example in examples():
        module = MODULE.match(example.code) if example.kind == "python" else None
        if module:
            out.append((example, module.group(1)))
        elif example.kind == "python" and 'pathlib.Path("models/' in example.code:
            out.append((example, ""))
    return out


@pytest.fixture(scope="module")
def readme(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Readme]:
    """The models written by the documents' own snippets, an API, and a worker for the models the examples use."""
    tmp = tmp_path_factory.mktemp("readme")
    stack = new_stack(tmp, INFERQ_TEST_SLOW_S="0")
    shutil.copytree(ROOT / "models" / "langid", stack.models_dir / "langid")
    (tmp / "samples").symlink_to(ROOT / "samples")
    # A copy: docs/kubernetes.md's `inferq manifests version ... --write` writes into it.
    shutil.copytree(ROOT / "deploy" / "kubernetes", tmp / "deploy" / "kubernetes")
    base_env = {k: v for k, v in os.environ.items() if not k.startswith("INFERQ_")}
    # The safetensors model's module sits in the working folder, as docs/serving.md's "importable by the worker".
    env = base_env | stack.env | {"PYTHONPATH": f"{ROOT}{os.pathsep}{tmp}"}
    stack.env = env
    with serving(stack):
        state = Readme(stack, tmp, env)
        for example, saved_as in model_snippets():
            if saved_as:
                (tmp / saved_as).write_text(example.code)
                continue
            state.model_snippets[example.where] = subprocess.run(
                [sys.executable, "-c", example.code], cwd=tmp, env=env, capture_output=True, text=True, timeout=180
            )
        assert (stack.models_dir / "tiny-onnx" / "config.json").exists(), state.model_snippets
        stack.start_api()
        stack.start_worker(*SERVED)
        for model in SERVED:
            stack.wait_for_worker(model, timeout_s=120)
        yield state


def run_example(readme: Readme, example: Example) -> None:
    if example.kind == "python":
        run_python(readme, example)
    elif example.code.startswith("curl "):
        run_curl(readme, example)
    else:
        run_command(readme, example)


def run_python(readme: Readme, example: Example) -> None:
    if example.where in readme.model_snippets:
        done = readme.model_snippets[example.where]
    elif module := MODULE.match(example.code):
        assert (readme.work / module.group(1)).read_text() == example.code
        return
    else:
        code = readme.adapt(example.code)
        done = subprocess.run(
            [sys.executable, "-c", code], cwd=readme.work, env=readme.env, capture_output=True, text=True, timeout=120
        )
    assert done.returncode == 0, f"{example.where}:\n{done.stdout}\n{done.stderr}"
    # A print whose comment shows what it prints (the Triton snippet's label).
    for line in example.code.splitlines():
        printed = re.match(r"print\(.*\)\s+#\s+(\[.*\])$", line)
        if printed:
            assert done.stdout.strip().splitlines()[-1] == printed.group(1), done.stdout


def run_curl(readme: Readme, example: Example) -> None:
    done = readme.run(readme.adapt(example.code) + " --write-out '\\n%{http_code}'")
    assert done.returncode == 0, f"{example.where}: {done.stderr}"
    body, _, status = done.stdout.rpartition("\n")
    if "/cancel" in example.code:
        # The examples before it waited for the job or batch to end: "409 if it already ended".
        assert status == "409", (example.code, status, body)
        return
    assert status in ("200", "202"), (example.code, status, body)
    answers = [json.loads(line) for line in body.splitlines() if line.startswith("{")]
    if "Prefer: wait" in example.code and status == "202":
        # Not ended within the example's wait on a busy machine: what the document shows is the ended job.
        answers = [httpx.get(f"{readme.stack.base}/v1/jobs/{answers[0]['id']}", params={"wait": 60}, timeout=70).json()]
    wanted = shown_fields(example)
    missing = wanted - {name for answer in answers for name in fields_in(answer)}
    assert not missing, f"{example.where} shows fields its answer lacks: {sorted(missing)}\n{body}"
    shown_id = re.search(r'"id":"([^"]+)"', " ".join(example.shown))
    if shown_id and PLACEHOLDER.fullmatch(shown_id.group(1)):
        readme.bound[shown_id.group(1)] = answers[0]["id"]
        readme.wait_for_end(answers[0]["id"], "batches" if "/batches" in example.code else "jobs")


def run_command(readme: Readme, example: Example) -> None:
    done = readme.run(readme.adapt(example.code))
    if example.note.startswith("inferq: "):
        # The document shows the one line such a command prints on stderr, and it exits 2.
        expected = example.note.replace(README_API, readme.stack.base.removeprefix("http://")).split("…")[0]
        assert (done.returncode, done.stderr.startswith(expected)) == (2, True), done.stderr
        return
    assert done.returncode == 0, f"{example.where}:\n{done.stdout}\n{done.stderr}"
    if example.code.startswith(".venv/bin/rq info"):
        assert "inferq.digits" in done.stdout, done.stdout


@pytest.mark.parametrize("example", params())
def test_the_readme_example_runs_as_written(readme: Readme, example: Example) -> None:
    reason = reason_not_run(example)
    assert reason is None, f"{example.where} is an example this test neither runs nor skips"
    run_example(readme, example)


def test_the_examples_come_from_the_readme_and_every_page() -> None:
    """No page of docs/ escapes this test: each is in the nav (mkdocs build --strict fails otherwise), so read here."""
    pages = {path.relative_to(ROOT).as_posix() for path in (ROOT / "docs").rglob("*.md")}
    assert set(documents()) == {"README.md", "CONTRIBUTING.md", *pages}
    assert documents()[0] == "README.md"
