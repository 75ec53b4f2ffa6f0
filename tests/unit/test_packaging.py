"""One importable package: api/, shared/ and workers/ are inferq.api, inferq.shared and inferq.workers."""

from __future__ import annotations

import fakeredis

from inferq.shared.lifecycle import layout
from inferq.shared.rqjson import JSONJob
from inferq.workers import tasks, webhooks


def test_a_job_stored_under_a_folders_bare_name_still_finds_its_function() -> None:
    """Jobs queued before the move name "workers.webhooks.deliver": RQ finds that function in the package now."""
    connection = fakeredis.FakeRedis()
    for stored, function in (("workers.webhooks.deliver", webhooks.deliver), ("workers.tasks.infer", tasks.infer)):
        assert JSONJob.create(stored, connection=connection).func is function
    assert JSONJob.create(layout.DELIVER_FUNC, connection=connection).func is webhooks.deliver
    assert JSONJob.create("json.dumps", connection=connection).func.__module__ == "json"
