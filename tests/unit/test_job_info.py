"""The info hash's record (shared/lifecycle/info.py): what a submit and a finish write, read back typed."""

from __future__ import annotations

import re
import time

from inferq.shared.lifecycle.info import F, JobInfo, at_finish, at_submit, at_upload
from inferq.shared.lifecycle.lua import SOURCES, Script


def test_a_submit_and_a_finish_read_back_as_written() -> None:
    deadline = time.time() + 60
    raw = at_submit("m", "image/png", deadline, "https://h/", "owner-hash", waited=True)
    assert raw[F.WAITED] == "1" and raw[F.CONTENT_TYPE] == "image/png"
    raw |= at_finish(3, "w1", "2.500", queue_ms=1.25, error="boom")
    info = JobInfo.of(raw)
    assert info == JobInfo(
        model="m",
        deadline=round(deadline, 3),
        webhook="https://h/",
        owner="owner-hash",
        batch_size=3,
        worker="w1",
        timings_ms={"queue_ms": 1.25, "inference_ms": 2.5},
        error="boom",
        canceled=False,
    )
    assert info.ran


def test_what_is_not_written_reads_as_absent() -> None:
    raw = at_submit("m", "text/plain", 0.0, None, None, waited=False)
    assert set(raw) == {F.MODEL, F.CONTENT_TYPE, F.DEADLINE}
    info = JobInfo.of(raw)
    assert (info.webhook, info.owner, info.batch_size, info.timings_ms, info.error) == (None,) * 5
    assert not info.ran and not info.canceled
    assert set(at_finish(1, "w", "1.000")) == {F.BATCH_SIZE, F.WORKER, F.INFERENCE_MS}


def test_the_scripts_name_the_info_fields_by_the_record_never_by_literal() -> None:
    """The scripts read and write the info hash as F.<NAME>, handed to them from info.F: a renamed field in Python
    renames it in Lua, and a name Lua spells that the record lacks fails here, not on a live server."""
    fields = {name: value for name, value in vars(F).items() if name.isupper()}
    lua = {path.name: path.read_text() for path in SOURCES.rglob("*.lua")}
    used = {name for text in lua.values() for name in re.findall(r"\bF\.([A-Z_]+)", text)}
    assert used <= set(fields), used - set(fields)
    assert {F.ITEMS, F.ANNOUNCED, F.CANCELED, F.COUNTED, F.CUSTOM_IDS, F.DEADLINE} <= {fields[n] for n in used}
    for name, text in lua.items():
        for call in re.findall(r"redis\.call\('H\w+', (?:d\.)?info, ([^)]*)\)", text):
            literals = set(re.findall(r"'([^']*)'", call))
            assert not literals & set(fields.values()), f"{name}: {call}"
    body = Script.load("start").body  # each F.<NAME> written out as the field's name
    assert not re.search(r"(?<![\w.])F\.[A-Z_]", body)
    assert all(f"'{fields[n]}'" in body for n in re.findall(r"\bF\.([A-Z_]+)", Script.load("start").source))


def test_a_chunk_is_staged_with_the_fields_the_scripts_read() -> None:
    raw = at_upload("c-1", "m", "b", 3, "application/x-chunk", "1.000", '"a"\n"b"\n"c"')
    assert {F.ID, F.BATCH, F.ITEMS, F.CUSTOM_IDS, F.DEADLINE} <= set(raw)
    assert raw[F.ITEMS] == 3
