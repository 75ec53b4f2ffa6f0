"""The docs site builds with ``mkdocs build --strict``, and its configuration page is the settings' own words.

The build fails on any warning: a broken link or anchor, a page left out of the nav, or a configuration table
that is not what ``shared/settings.py`` describes (docs/hooks.py warns then). The build's tests are skipped, with
the reason, only where mkdocs-material is not installed; the configuration tests need no mkdocs.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
from pydantic import Field

import inferq.shared.settings
from inferq.shared.settings import PREFIX, Settings

# The repository: the folder above that holds mkdocs.yml (this file may sit in a lane's folder of tests/).
ROOT = next(folder for folder in Path(__file__).resolve().parents if (folder / "mkdocs.yml").is_file())
CONFIGURATION = ROOT / "docs" / "configuration.md"
# Where INFERQ_* variables are read or set, outside the tests: each must be documented on the configuration page.
READERS = ("api", "shared", "workers", "inferq", "bench", "samples", "models", "deploy")
READER_FILES = ("Makefile", "Dockerfile", "docker-compose.yml", ".ci/run")
BINARY = (".png", ".pt", ".pt2", ".safetensors", ".onnx", ".pyc", ".bin")


def hooks() -> ModuleType:
    """docs/hooks.py, which is no package's module: mkdocs loads it by path, as this does."""
    spec = importlib.util.spec_from_file_location("inferq_docs_hooks", ROOT / "docs" / "hooks.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def mkdocs_build(config: Path, site: Path) -> subprocess.CompletedProcess[str]:
    # Looked up, not imported: this process keeps its warnings-as-errors for the project's own code.
    missing = [name for name in ("mkdocs", "material") if importlib.util.find_spec(name) is None]
    if missing:
        pytest.skip(f"{' and '.join(missing)} not installed: mkdocs-material comes with the dev extra (make setup)")
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file", str(config), "--site-dir", str(site)],
        cwd=config.parent,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        capture_output=True,
        text=True,
        timeout=120,
    )


def copy_of_the_docs(tmp_path: Path) -> Path:
    """The site's sources in a folder of their own, to break on purpose."""
    for name in ("mkdocs.yml", "README.md", "CONTRIBUTING.md"):
        shutil.copy(ROOT / name, tmp_path / name)
    shutil.copytree(ROOT / "docs", tmp_path / "docs", ignore=shutil.ignore_patterns("__pycache__"))
    return tmp_path / "mkdocs.yml"


@pytest.mark.timeout(180)
def test_the_site_builds_strict_and_offline(tmp_path: Path) -> None:
    done = mkdocs_build(ROOT / "mkdocs.yml", tmp_path / "site")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "WARNING" not in done.stderr, done.stderr
    site = tmp_path / "site"
    for page in ("index", "api", "configuration", "contributing", "redis", "performance/index"):
        assert (site / f"{page}.html").is_file(), page
    home = (site / "index.html").read_text()
    # The README is the home page, its links to docs/ rewritten for the site.
    assert "A first job" in home
    assert 'href="api.html"' in home and 'href="contributing.html"' in home
    assert "docs/api.md" not in home
    # Nothing is fetched when a page is read: no web fonts, no CDN.
    assert not re.search(r"fonts\.googleapis|fonts\.gstatic|cdn\.jsdelivr|unpkg\.com", home)
    # The configuration page holds the generated table, every setting's row.
    configuration = (site / "configuration.html").read_text()
    assert all(f"<code>{PREFIX}{name.upper()}</code>" in configuration for name in Settings.model_fields)


@pytest.mark.timeout(180)
@pytest.mark.parametrize(
    ("breakage", "named"),
    [
        ("a link to a page that does not exist", "no-such-page.md"),
        ("a link to an anchor that does not exist", "#no-such-section"),
        ("a page left out of the nav", "orphan.md"),
        ("a stale configuration table", "configuration.md"),
    ],
)
def test_the_strict_build_fails_on(tmp_path: Path, breakage: str, named: str) -> None:
    config = copy_of_the_docs(tmp_path)
    docs = tmp_path / "docs"
    if breakage == "a link to a page that does not exist":
        (docs / "api.md").write_text((docs / "api.md").read_text() + "\n[gone](no-such-page.md)\n")
    elif breakage == "a link to an anchor that does not exist":
        (docs / "api.md").write_text((docs / "api.md").read_text() + "\n[gone](models.md#no-such-section)\n")
    elif breakage == "a page left out of the nav":
        (docs / "orphan.md").write_text("# Orphan\n")
    else:
        page = (docs / "configuration.md").read_text()
        (docs / "configuration.md").write_text(page.replace("| `INFERQ_API_KEYS` |", "| `INFERQ_API_KEY` |"))
    done = mkdocs_build(config, tmp_path / "site")
    assert done.returncode != 0, done.stdout + done.stderr
    assert named in done.stderr, done.stderr


def test_the_configuration_page_is_what_the_settings_say() -> None:
    """docs/configuration.md's table equals the one generated from Settings: `python docs/hooks.py` rewrites it."""
    module = hooks()
    page = CONFIGURATION.read_text()
    assert module.with_table(page, module.settings_table()) == page
    for name, field in Settings.model_fields.items():
        row = next(line for line in page.splitlines() if line.startswith(f"| `{PREFIX}{name.upper()}` |"))
        assert row.endswith(f" | {field.description} |"), row


def test_a_new_setting_cannot_be_left_out_of_the_docs(monkeypatch: pytest.MonkeyPatch) -> None:
    module = hooks()
    page = CONFIGURATION.read_text()

    class Undescribed(Settings):
        brand_new_s: int = 1

    monkeypatch.setattr(inferq.shared.settings, "Settings", Undescribed)
    with pytest.raises(ValueError, match="Settings.brand_new_s has no description"):
        module.settings_table()

    class Described(Settings):
        brand_new_s: int = Field(default=1, ge=0, description="a setting added after the page was written")

    monkeypatch.setattr(inferq.shared.settings, "Settings", Described)
    table = module.settings_table()
    assert "| `INFERQ_BRAND_NEW_S` | integer | `1` | ≥ 0 | a setting added after the page was written |" in table
    assert module.with_table(page, table) != page


def test_every_inferq_variable_the_code_reads_is_documented() -> None:
    """Settings and the few variables read elsewhere (the CLI's log level, the bench's, the test models')."""
    paths = [path for folder in READERS for path in (ROOT / folder).rglob("*") if path.is_file()]
    paths += [ROOT / name for name in READER_FILES if (ROOT / name).is_file()]
    names = set()
    for path in paths:
        if path.suffix in BINARY:
            continue
        names |= set(re.findall(r"\bINFERQ_[A-Z0-9_]*[A-Z0-9_]", path.read_text(errors="ignore")))
    page = CONFIGURATION.read_text()
    # A name that ends with "_" is a prefix (INFERQ_TEST_): documented with a "*".
    documented = {name: name + "*" if name.endswith("_") else name for name in names}
    missing = sorted(name for name, written in documented.items() if written not in page)
    assert missing == []
    assert {"INFERQ_LOG_LEVEL", "INFERQ_BENCH_LOADGEN", "INFERQ_API_KEYS"} <= names


def test_links_are_rewritten_for_the_site() -> None:
    module = hooks()
    readme = "[a](docs/api.md#routes) [b](CONTRIBUTING.md) [c](https://example.com/x.md) [d](#quick-start) [e](x/y.md)"
    assert module.site_links(readme, "README.md", "index.md") == (
        "[a](api.md#routes) [b](contributing.md) [c](https://example.com/x.md) [d](#quick-start) [e](x/y.md)"
    )
    page = "[q](../../README.md#quick-start) [r](../redis.md) ![p](2026-11-25.png)"
    assert module.site_links(page, "docs/performance/index.md", "performance/index.md") == (
        "[q](../index.md#quick-start) [r](../redis.md) ![p](2026-11-25.png)"
    )
    contributing = "[s](docs/serving.md#your-own-handler) [t](README.md)"
    assert module.site_links(contributing, "CONTRIBUTING.md", "contributing.md") == (
        "[s](serving.md#your-own-handler) [t](index.md)"
    )
