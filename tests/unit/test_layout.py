"""The packages' dependencies point one way, read statically with ``ast`` (nothing is imported).

    inferq (CLI) -> api, workers -> shared

``shared`` is the common base; the API never loads torch or worker code; only the CLI wires things up. The folders
api/, shared/ and workers/ are imported as inferq.api, inferq.shared and inferq.workers (links in inferq/ and the
wheel's package-dir): each layer below is named by its folder.
"""

from __future__ import annotations

import ast
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LAYERED = ("api", "workers", "shared")
ALL_PACKAGES = (*LAYERED, "inferq")
# A module this long is listed at the end of the run (split it along a seam if it has one, never to pass a count);
# past MAX_LINES it fails.
ADVISORY_LINES = 500
MAX_LINES = 800

# Top-level packages each layer must not import. The API imports shared, so shared stays torch-free
# too (shared/models.py says so); the transitive test below checks the API's whole import closure.
FORBIDDEN = {
    "shared": {"api", "workers", "inferq", "torch"},
    "api": {"workers", "inferq", "torch"},
    "workers": {"api", "inferq"},
}
PICKLE_FAMILY = {"pickle", "_pickle", "cPickle", "cloudpickle", "dill"}
ENV_READERS = {"environ", "environb", "getenv", "getenvb"}


@dataclass(frozen=True)
class Module:
    name: str
    path: Path
    is_package: bool

    @property
    def rel(self) -> str:
        return self.path.relative_to(ROOT).as_posix() if self.path.is_relative_to(ROOT) else self.path.name


@dataclass(frozen=True)
class Import:
    module: str  # absolute dotted name
    lineno: int


def _modules(packages: tuple[str, ...]) -> list[Module]:
    """The modules of these folders, by the names they are imported as (api/deps.py is inferq.api.deps)."""
    out = []
    for package in packages:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if package == "inferq" and parts[1] in LAYERED:
                continue  # inferq/api is the link to api/: its modules are listed once, from their own folder
            if package in LAYERED:
                parts.insert(0, "inferq")
            is_package = parts[-1] == "__init__"
            if is_package:
                parts.pop()
            out.append(Module(".".join(parts), path, is_package))
    return out


@cache
def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"), filename=str(path))


def _imports(module: Module) -> list[Import]:
    """Every import in the file, at any depth (functions, TYPE_CHECKING blocks), made absolute."""
    out = []
    for node in ast.walk(_tree(module.path)):
        if isinstance(node, ast.Import):
            out += [Import(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                package = module.name.split(".")
                if not module.is_package:
                    package.pop()
                base = package[: len(package) - (node.level - 1)]
                prefix = ".".join([*base, node.module] if node.module else base)
            else:
                prefix = node.module or ""
            # `from x import y` may import the module x.y: record both, the top level is what matters here.
            out.append(Import(prefix, node.lineno))
            out += [Import(f"{prefix}.{alias.name}", node.lineno) for alias in node.names if alias.name != "*"]
    return out


def _top(name: str) -> str:
    """The layer a dotted name belongs to: ``api``, ``shared`` or ``workers`` for inferq.<folder>…, ``inferq`` for the
    rest of inferq (the CLI and the SDK), else its top-level package (``torch``, ``pickle``)."""
    parts = name.split(".")
    if parts[0] == "inferq" and len(parts) > 1 and parts[1] in LAYERED:
        return parts[1]
    return parts[0]


def _violations(modules: list[Module], banned: set[str]) -> list[str]:
    found = {
        f"{m.rel}:{imp.lineno}: imports {imp.module}"
        for m in modules
        for imp in _imports(m)
        if _top(imp.module) in banned
    }
    return sorted(found)


def test_packages_exist() -> None:
    for package in ALL_PACKAGES:
        assert (ROOT / package / "__init__.py").is_file(), package
    for package in LAYERED:  # imported as inferq.<folder>: inferq/<folder> is a link to it
        assert (ROOT / "inferq" / package).is_symlink() and (ROOT / "inferq" / package).resolve() == ROOT / package
    assert len(_modules(LAYERED)) > 10


def test_nothing_imports_a_server_folder_by_its_bare_name() -> None:
    """``import shared.keys`` would load a second copy of inferq.shared.keys (its own settings cache, scripts, …)."""
    code = _modules((*ALL_PACKAGES, "tests", "bench", "models"))
    code.append(Module("docs.hooks", ROOT / "docs" / "hooks.py", is_package=False))
    bare = {
        f"{m.rel}:{imp.lineno}: imports {imp.module}"
        for m in code
        for imp in _imports(m)
        if imp.module.split(".")[0] in LAYERED
    }
    assert sorted(bare) == []


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_dependencies_point_one_way(package: str) -> None:
    assert _violations(_modules((package,)), FORBIDDEN[package]) == []


def test_api_import_closure_has_no_torch() -> None:
    """Following the project's own imports from api/, torch is never reached."""
    by_name = {m.name: m for m in _modules(ALL_PACKAGES)}
    seen: dict[str, str] = {}  # module -> how it was reached
    todo = [(m.name, m.rel) for m in by_name.values() if _top(m.name) == "api"]
    while todo:
        name, via = todo.pop()
        if name in seen:
            continue
        seen[name] = via
        parts = name.split(".")
        # Importing a.b.c runs a/__init__.py and a/b/__init__.py first.
        todo += [(".".join(parts[:n]), via) for n in range(1, len(parts))]
        if name in by_name:
            for imp in _imports(by_name[name]):
                todo.append((imp.module, f"{by_name[name].rel}:{imp.lineno}"))
    assert sorted(f"{via} -> {name}" for name, via in seen.items() if _top(name) == "torch") == []


def test_nothing_imports_pickle() -> None:
    assert _violations(_modules(ALL_PACKAGES), PICKLE_FAMILY) == []


# RQ's stored results are written and read in shared/lifecycle/ alone (read: rqhash.py, with RQ's job hash);
# anything else reads a job through shared.jobs, so a change of RQ's layout lands there. shared/rqjson.py
# only swaps RQ's serializer for JSON.


def test_only_the_lifecycle_knows_how_rq_stores_results() -> None:
    found = [
        f"{m.rel}:{imp.lineno}: imports {imp.module}"
        for m in _modules(ALL_PACKAGES)
        if not m.name.startswith("inferq.shared.lifecycle") and m.name != "inferq.shared.rqjson"
        for imp in _imports(m)
        if imp.module == "rq.results" or imp.module.startswith("rq.results.")
    ]
    assert found == []


def _env_reads(module: Module) -> Iterator[str]:
    tree = _tree(module.path)
    os_names = {"os"}  # names bound to the os module in this file (`import os as _os`)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            os_names |= {alias.asname for alias in node.names if alias.name == "os" and alias.asname}
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in ENV_READERS:
            if isinstance(node.value, ast.Name) and node.value.id in os_names:
                yield f"{module.rel}:{node.lineno}: {node.value.id}.{node.attr}"
        elif isinstance(node, ast.ImportFrom) and node.module == "os" and not node.level:
            for alias in node.names:
                if alias.name in ENV_READERS:
                    yield f"{module.rel}:{node.lineno}: from os import {alias.name}"


def test_settings_are_read_only_through_shared_settings() -> None:
    """No os.environ / os.getenv in api/, shared/, workers/: shared/settings.py's pydantic-settings reads them."""
    assert sorted(hit for m in _modules(LAYERED) for hit in _env_reads(m)) == []


def _by_size(sizes: list[tuple[int, str]]) -> tuple[list[str], list[str]]:
    """The modules to list (at least ADVISORY_LINES, up to MAX_LINES) and those that fail (past MAX_LINES)."""
    listed = [f"{rel}: {lines} lines" for lines, rel in sizes if ADVISORY_LINES <= lines <= MAX_LINES]
    failing = [f"{rel}: {lines} lines" for lines, rel in sizes if lines > MAX_LINES]
    return listed, failing


def test_modules_stay_small(capsys: pytest.CaptureFixture[str], advise: Callable[[str], None]) -> None:
    sizes = sorted(
        ((len(m.path.read_text(encoding="utf-8").splitlines()), m.rel) for m in _modules(ALL_PACKAGES)), reverse=True
    )
    with capsys.disabled():
        print(f"\nlargest modules (listed from {ADVISORY_LINES} lines, failing past {MAX_LINES}):")
        for lines, rel in sizes[:5]:
            print(f"  {lines:5d}  {rel}")
    listed, failing = _by_size(sizes)
    for line in listed:
        advise(f"{line} (at least {ADVISORY_LINES}: one concept still? fails past {MAX_LINES})")
    assert failing == []


def test_module_sizes_are_listed_then_failed() -> None:
    listed, failing = _by_size([(801, "a.py"), (800, "b.py"), (500, "c.py"), (499, "d.py")])
    assert listed == ["b.py: 800 lines", "c.py: 500 lines"]
    assert failing == ["a.py: 801 lines"]


def test_the_checks_see_violations(tmp_path: Path) -> None:
    """The AST readers themselves: relative imports resolve, aliases of os are followed."""
    path = tmp_path / "mod.py"
    path.write_text(
        "import os as _os\nfrom os import getenv\nfrom .. import deps\nfrom .health import router\n"
        "import pickle\nx = _os.environ['A']\n\ndef f():\n    from inferq.cli import main\n",
        encoding="utf-8",
    )
    module = Module("inferq.api.routers.mod", path, is_package=False)
    names = {i.module for i in _imports(module)}
    assert {"inferq.api.deps", "inferq.api.routers.health.router", "inferq.cli", "pickle"} <= names
    assert _violations([module], FORBIDDEN["api"]) == [
        "mod.py:9: imports inferq.cli",
        "mod.py:9: imports inferq.cli.main",
    ]
    reads = sorted(hit.split(": ", 1)[1] for hit in _env_reads(module))
    assert reads == ["_os.environ", "from os import getenv"]
    assert _violations([module], {"pickle"}) == ["mod.py:5: imports pickle"]


# What may hold the API's synchronous client in a route without using it there: its methods run in the threadpool
# (a bulk upload's writer) or on a thread of its own (the request counts' flusher).
_KEEPS_THE_SYNC_CLIENT = {"BatchWriter", "Flusher"}


def _sync_client_on_the_loop(path: Path) -> list[str]:
    """Uses of a shard's synchronous client (``.redis``, ``.queues``) in an async function of ``path`` that are not
    handed whole to ``run_in_threadpool`` (api/deps.py's ``Shard`` states the rule)."""
    found = []
    for func in ast.walk(_tree(path)):
        if not isinstance(func, ast.AsyncFunctionDef):
            continue
        handed: set[int] = set()
        stack: list[ast.AST] = list(func.body)
        while stack:
            node = stack.pop()
            if isinstance(node, ast.FunctionDef | ast.Lambda | ast.AsyncFunctionDef):
                continue  # a nested function: a sync one runs where it is handed, an async one is checked itself
            if isinstance(node, ast.Call):
                func_of = node.func
                name = func_of.id if isinstance(func_of, ast.Name) else getattr(func_of, "attr", None)
                if name == "run_in_threadpool" or name in _KEEPS_THE_SYNC_CLIENT:
                    handed |= {id(n) for arg in [*node.args, *(k.value for k in node.keywords)] for n in ast.walk(arg)}
                if isinstance(node.func, ast.Attribute) and node.func.attr == "close":  # closing waits on no server
                    handed |= {id(n) for n in ast.walk(node.func.value)}
            if (
                isinstance(node, ast.Attribute)
                and node.attr in {"redis", "queues"}
                and not (isinstance(node.value, ast.Name) and node.value.id == "config")  # a model's shard name
                and id(node) not in handed
            ):
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {ast.unparse(node)} in async {func.name}")
            stack.extend(ast.iter_child_nodes(node))
    return found


def test_routes_use_the_sync_redis_client_only_inside_the_threadpool() -> None:
    found = [v for path in sorted((ROOT / "api").rglob("*.py")) for v in _sync_client_on_the_loop(path)]
    assert found == []


def test_the_sync_client_check_sees_a_use_on_the_loop(tmp_path: Path) -> None:
    bad = tmp_path / "route.py"
    bad.write_text(
        "async def route(state):\n"
        "    await run_in_threadpool(census.read, state.redis)\n"
        "    state.redis.get('k')\n"
        "    writer = BatchWriter(state.redis)\n"
    )
    global ROOT
    saved, ROOT = ROOT, tmp_path
    try:
        assert _sync_client_on_the_loop(bad) == ["route.py:3: state.redis in async route"]
    finally:
        ROOT = saved
