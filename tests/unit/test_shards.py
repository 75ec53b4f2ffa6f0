"""INFERQ_REDIS_SHARDS names: a shard whose IDs would read as inferq's own RQ jobs is refused at start."""

from __future__ import annotations

import pytest

from inferq.shared import keys, shards
from inferq.shared.errors import ConfigError


@pytest.mark.timeout(10)
@pytest.mark.parametrize(("name", "reads_as"), [("batch", "bulk chunks"), ("webhook", "webhook deliveries")])
def test_a_shard_named_like_inferqs_own_job_prefixes_is_refused(name: str, reads_as: str) -> None:
    """Such a shard's every ID began with a chunk's or a delivery's prefix: new_id looped forever on a submit."""
    with pytest.raises(ConfigError, match=f"{name!r} cannot name a shard: its job IDs would read as {reads_as}"):
        shards.parse(f"{name}=redis://127.0.0.1:6390/0")


def test_other_shard_names_give_ids_that_lead_back_to_them() -> None:
    assert shards.parse("b=redis://h:1/0, batches=redis://h:2/0") == {"b": "redis://h:1/0", "batches": "redis://h:2/0"}
    for name in ("b", "batches"):
        job_id = shards.new_id(name)
        assert keys.is_client_job(job_id) and shards.of_id(job_id, ["b", "batches"]) == name
