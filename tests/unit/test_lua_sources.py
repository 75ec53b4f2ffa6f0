"""The lifecycle's Lua scripts live in shared/lifecycle/lua/, one file each, loaded by name; none is stray."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from inferq.shared.lifecycle import scripts
from inferq.shared.lifecycle.lua import SOURCES, Script, library, parse_args


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


def test_an_argv_declaration_reads_every_form() -> None:
    args = parse_args("id, ids[], jobs[id, execution], info<>, @metrics, shape{a, b[]}")
    assert [(a.name, a.kind) for a in args] == [
        ("id", "value"),
        ("ids", "list"),
        ("jobs", "records"),
        ("info", "pairs"),
        ("metrics", "record"),
        ("shape", "record"),
    ]
    assert [f.name for f in args[4].fields] == ["ttl", "window_ttl", "keep", "failures_ttl", "now"]
    assert [(f.name, f.kind) for f in args[5].fields] == [("a", "value"), ("b", "list")]
    for bad in ("a, a", "a[", "a, , b", "x{y"):
        with pytest.raises((ValueError, IndexError)):
            parse_args(bad)


def test_a_call_gives_exactly_the_declared_names_and_they_go_out_in_order() -> None:
    script = Script("t", ("k",), "return 1", args=parse_args("id, jobs[id, execution], info<>, tail[]"))
    out = script._args(
        {"tail": ["x"], "info": {"a": 1, "b": 2}, "jobs": [("j1", "e1"), {"execution": "e2", "id": "j2"}], "id": 7},
        False,
    )
    assert out == [7, 2, "j1", "e1", "j2", "e2", 2, "a", 1, "b", 2, 1, "x"]
    with pytest.raises(TypeError, match="takes"):
        script._args({"id": 7, "jobs": [], "info": {}}, False)  # one missing
    with pytest.raises(TypeError, match="takes"):
        script._args({"id": 7, "jobs": [], "info": {}, "tail": [], "extra": 1}, False)
    with pytest.raises(TypeError, match="takes"):
        script._args({"id": 7, "jobs": [("j1",)], "info": {}, "tail": []}, False)


def test_every_script_declares_its_arguments_and_uses_no_positional_argv() -> None:
    for script in scripts.ALL:
        text = (SOURCES / f"{script.name}.lua").read_text()
        assert any(line.startswith("-- ARGV: ") for line in text.partition("\n\n")[0].splitlines()), script.name
        assert "ARGV[" not in text, script.name
        used = set(re.findall(r"\bA\.([a-z_]+)", script.source))
        assert used <= {a.name for a in script.args}, (script.name, used - {a.name for a in script.args})
        keys_used = set(re.findall(r"\bK\.([a-z_]+)", script.source))
        assert keys_used <= set(script.keys), (script.name, keys_used - set(script.keys))
    for lib in (SOURCES / "lib").glob("*.lua"):
        assert "ARGV[" not in lib.read_text(), lib.name


def test_a_key_or_info_field_a_script_does_not_declare_fails_when_its_body_is_built() -> None:
    assert "KEYS[2]" in Script("ok", ("a", "b"), "return K.b").body
    assert "'canceled'" in Script("ok", ("a",), "return F.CANCELED").body
    with pytest.raises(ValueError, match=r"K\.c is not declared"):
        _ = Script("typo", ("a", "b"), "return K.c").body
    with pytest.raises(ValueError, match=r"F\.CANCELLED is not declared"):
        _ = Script("typo", ("a",), "return F.CANCELLED").body
