"""`pip install inferq` is the client: the SDK and the CLI's client commands with httpx and pydantic, and no
server (torch, FastAPI, Redis clients, transformers come with the `server` extra). Built as a wheel from this
checkout and installed alone in a fresh venv, then used against a real stack."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.models import ROOT
from tests.support.stack import Stack

pytestmark = pytest.mark.timeout(600)
NOT_SOURCES = (".git", ".venv", ".inferq", "site", "build", "*.egg-info", "__pycache__", ".mypy_cache", ".ruff_cache")
SERVER_ONLY = ("torch", "fastapi", "uvicorn", "transformers", "redis", "rq", "numpy", "PIL")


def _run(*cmd: str | Path, timeout: float = 300, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=timeout, cwd=cwd)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    # Built from a copy: setuptools writes build/ and *.egg-info beside the sources it builds.
    source = out / "source"
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(*NOT_SOURCES))
    built = _run(sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", out, source)
    if built.returncode != 0:
        pytest.skip(f"pip could not build the wheel here (its build backend comes from the index): {built.stderr}")
    (path,) = out.glob("inferq-*.whl")
    return path


@pytest.fixture(scope="module")
def client_venv(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    venv = tmp_path_factory.mktemp("client") / "venv"
    assert _run(sys.executable, "-m", "venv", venv).returncode == 0
    installed = _run(venv / "bin" / "python", "-m", "pip", "install", "-q", wheel)
    if installed.returncode != 0:
        pytest.skip(f"pip could not install the client's dependencies here: {installed.stderr}")
    yield venv


def test_the_client_install_holds_the_sdk_and_none_of_the_server(client_venv: Path) -> None:
    code = (
        "import importlib.util\n"
        "from inferq.client import AsyncClient, Client, verify_webhook\n"
        f"print([m for m in {(*SERVER_ONLY, 'api', 'shared', 'workers')!r} if importlib.util.find_spec(m) is not None])"
    )
    # Run away from the checkout: `python -c` puts its working directory first on sys.path.
    found = _run(client_venv / "bin" / "python", "-c", code, cwd=client_venv)
    assert found.returncode == 0, found.stderr
    assert found.stdout.strip() == "[]"


def test_the_client_commands_work_and_the_server_commands_say_what_to_install(client_venv: Path, stack: Stack) -> None:
    listed = _run(client_venv / "bin" / "inferq", "models", "--api", stack.base, timeout=60)
    assert listed.returncode == 0, listed.stderr
    assert listed.stdout.startswith("digits ")
    for command in (["up"], ["worker", "--model", "digits"], ["api"]):
        refused = _run(client_venv / "bin" / "inferq", *command, timeout=60)
        assert refused.returncode == 78, refused.stderr
        assert "pip install 'inferq[server]'" in refused.stderr


def test_the_wheel_carries_the_lifecycle_scripts(wheel: Path) -> None:
    lua = sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "shared/lifecycle/lua").rglob("*.lua"))
    with zipfile.ZipFile(wheel) as archive:
        shipped = sorted(name for name in archive.namelist() if name.endswith(".lua"))
    assert shipped == [f"inferq/{name}" for name in lua] and len(lua) > 10


def test_the_wheel_installs_one_package(wheel: Path) -> None:
    """Nothing named api, shared or workers lands in a user's site-packages: the server's folders are inside inferq."""
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
    assert {name.split("/")[0] for name in names if not name.split("/")[0].endswith(".dist-info")} == {"inferq"}
    for folder in ("api", "shared", "workers"):
        assert f"inferq/{folder}/__init__.py" in names
    assert "inferq/api/static/index.html" in names
