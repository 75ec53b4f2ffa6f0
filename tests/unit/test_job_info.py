"""The info hash's record (shared/lifecycle/info.py): what a submit and a finish write, read back typed."""

from __future__ import annotations

import time

from inferq.shared.lifecycle.info import F, JobInfo, at_finish, at_submit
from inferq.shared.lifecycle.lua import SOURCES


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


def test_the_scripts_name_the_fields_they_share_with_python_as_the_record_does() -> None:
    lua = "".join(path.read_text() for path in SOURCES.rglob("*.lua"))
    for name in (F.MODEL, F.DEADLINE, F.WEBHOOK, F.OWNER, F.BATCH_SIZE, F.CANCELED, F.ANNOUNCED):
        assert f"'{name}'" in lua, name
