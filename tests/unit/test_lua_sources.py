"""The lifecycle's Lua scripts live in shared/lifecycle/lua/, one file each, loaded by name; none is stray."""

from __future__ import annotations

from pathlib import Path

import pytest

from inferq.shared.lifecycle import scripts
from inferq.shared.lifecycle.lua import SOURCES, Script, library


def test_every_lua_file_is_a_loaded_script_or_a_used_library() -> None:
    names = [s.name for s in scripts.ALL]
    assert len(names) == len(set(names))
    assert sorted(p.stem for p in SOURCES.glob("*.lua")) == sorted(names)
    for lib in (SOURCES / "lib").glob("*.lua"):
        assert any(library(lib.stem) in s.source for s in scripts.ALL), f"{lib.name} is used by no script"


def test_a_script_is_its_file_after_the_libraries_its_header_names(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "one.lua").write_text("-- one: a function\n\nlocal function one() return 1 end\n")
    (tmp_path / "x.lua").write_text(
        "-- x: a script\n-- ARGV: none\n--\n-- KEYS: a, b\n-- KEYS per item: c\n-- uses: one\n\nreturn one()\n"
    )
    monkeypatch.setattr("inferq.shared.lifecycle.lua.SOURCES", tmp_path)
    script = Script.load("x")
    assert (script.name, script.keys, script.per_item) == ("x", ("a", "b"), ("c",))
    assert script.source == "\nlocal function one() return 1 end\n\nreturn one()\n"
    assert script.body.startswith("-- inferq:x\nlocal FIXED, STRIDE = 2, 1\n")


def test_each_script_says_what_it_does_and_declares_its_keys() -> None:
    for path in SOURCES.glob("*.lua"):
        head = path.read_text().partition("\n\n")[0].splitlines()
        assert head[0].startswith(f"-- {path.stem}: ") and len(head[0]) > len(path.stem) + 6, path.name
        assert any(line.startswith("-- KEYS: ") for line in head), path.name


def test_a_batch_delivery_subject_is_spelled_once_for_python_and_lua() -> None:
    """announce.lua queues a batch's delivery for BATCH_SUBJECT + its id; the sender reads the kind back from it."""
    from inferq.shared.lifecycle import layout

    assert f"local BATCH_SUBJECT = '{layout.BATCH_SUBJECT}'" in (SOURCES / "lib" / "announce.lua").read_text()
    assert layout.subject_of(layout.BATCH_SUBJECT + "abc") == ("batch", "abc")
    assert layout.subject_of("abc") == ("job", "abc")
    assert layout.batch_delivery_key("abc") == layout.delivery_key(layout.BATCH_SUBJECT + "abc")
