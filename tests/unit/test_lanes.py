"""Each test file sits in the lane its folder names, and test files share helpers only through tests/support.

Read statically with ``ast`` (nothing is imported). tests/conftest.py marks each test by its folder; a test that
starts what its lane does not allow would otherwise run in the wrong lane silently. The unit lane's conftest also
fails a unit test that reaches the session's redis-server through any fixture.
"""

from __future__ import annotations

import ast
from pathlib import Path

from tests.conftest import LANES, REDIS_FACING
from tests.support.models import ROOT

TESTS = ROOT / "tests"
# Where processes start: the stack (API, workers, CLIs) and Sentinel groups. Only end-to-end tests use them.
PROCESS_STARTERS = {"tests.support.stack", "tests.support.ha"}
# The redis-server starter: an integration test gets the session's server through the redis/redis_url fixtures.
REDIS_STARTER = "inferq.shared.redis_server"


def _test_files(tests: Path) -> list[Path]:
    return sorted(tests.rglob("test_*.py"))


def _rel(path: Path, tests: Path) -> str:
    return path.relative_to(tests.parent).as_posix()


def _imports(path: Path) -> set[str]:
    """Every module the file imports, at any depth; ``from x import y`` counts as x and as x.y."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found |= {node.module, *(f"{node.module}.{alias.name}" for alias in node.names)}
    return found


def _runs_python(path: Path) -> bool:
    """Whether the file starts Python processes of its own (``sys.executable``: inferq, rq, scripts)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    return any(isinstance(n, ast.Attribute) and n.attr == "executable" for n in ast.walk(tree))


def _outside_lanes(tests: Path) -> list[str]:
    return [
        _rel(p, tests)
        for p in _test_files(tests)
        if len(p.relative_to(tests).parts) != 2 or p.relative_to(tests).parts[0] not in LANES
    ]


def _test_imports(tests: Path) -> list[str]:
    """Imports of a test module (``tests.<...>.test_*``) by any file under tests/."""
    return sorted(
        f"{_rel(p, tests)}: imports {name}"
        for p in tests.rglob("*.py")
        for name in _imports(p)
        if name.startswith("tests.") and any(part.startswith("test_") for part in name.split(".")[1:])
    )


def _lane_violations(tests: Path, lane: str, banned: set[str]) -> list[str]:
    out = []
    for path in _test_files(tests / lane):
        imported = sorted(n for n in _imports(path) if any(n == b or n.startswith(f"{b}.") for b in banned))
        out += [f"{_rel(path, tests)}: imports {name}" for name in imported]
        if _runs_python(path):
            out.append(f"{_rel(path, tests)}: starts processes (sys.executable)")
    return out


def test_every_test_file_is_in_a_lane() -> None:
    assert _outside_lanes(TESTS) == []


def test_no_test_file_imports_another() -> None:
    assert _test_imports(TESTS) == []


def test_unit_tests_start_no_redis_server_and_no_process() -> None:
    assert _lane_violations(TESTS, "unit", PROCESS_STARTERS | {REDIS_STARTER}) == []


def test_integration_tests_start_no_process() -> None:
    assert _lane_violations(TESTS, "integration", PROCESS_STARTERS) == []


def test_every_redis_facing_name_is_one_test_file() -> None:
    """REDIS_FACING names files by stem: a renamed file would leave the Valkey pass silently."""
    stems = [p.stem for p in _test_files(TESTS)]
    assert sorted(REDIS_FACING - set(stems)) == []
    assert len(stems) == len(set(stems))


def test_the_checks_see_violations(tmp_path: Path) -> None:
    tests = tmp_path / "tests"
    for folder in ("unit", "integration", "e2e", "support", "other"):
        (tests / folder).mkdir(parents=True)
    (tests / "test_loose.py").write_text("")
    (tests / "other" / "test_astray.py").write_text("")
    (tests / "e2e" / "test_fine.py").write_text(
        "import sys\nfrom tests.support.stack import new_stack\nsys.executable\n"
    )
    (tests / "unit" / "test_a.py").write_text(
        "import subprocess, sys\nfrom inferq.shared.redis_server import RedisServer\n\n"
        "def test_x():\n    from tests.e2e.test_fine import thing\n    subprocess.run([sys.executable])\n"
    )
    (tests / "integration" / "test_b.py").write_text(
        "from inferq.shared.redis_server import free_port\nimport tests.support.ha\n"
    )
    (tests / "support" / "helper.py").write_text("from tests.integration import test_b\n")
    assert _outside_lanes(tests) == ["tests/other/test_astray.py", "tests/test_loose.py"]
    assert _test_imports(tests) == [
        "tests/support/helper.py: imports tests.integration.test_b",
        "tests/unit/test_a.py: imports tests.e2e.test_fine",
        "tests/unit/test_a.py: imports tests.e2e.test_fine.thing",
    ]
    assert _lane_violations(tests, "unit", PROCESS_STARTERS | {REDIS_STARTER}) == [
        "tests/unit/test_a.py: imports inferq.shared.redis_server",
        "tests/unit/test_a.py: imports inferq.shared.redis_server.RedisServer",
        "tests/unit/test_a.py: starts processes (sys.executable)",
    ]
    assert _lane_violations(tests, "integration", PROCESS_STARTERS) == [
        "tests/integration/test_b.py: imports tests.support.ha"
    ]
    assert _lane_violations(tests, "e2e", set()) == ["tests/e2e/test_fine.py: starts processes (sys.executable)"]
