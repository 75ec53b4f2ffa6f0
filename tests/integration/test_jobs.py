"""The job contract against a real redis-server: enqueue, view, cancel, pickle refused."""

from __future__ import annotations

import os
import pickle
import time

import pytest
import redis as redis_py
from rq.exceptions import DeserializationError
from rq.serializers import DefaultSerializer

from inferq.shared import keys
from inferq.shared.errors import ConfigError, Conflict, NotFound
from inferq.shared.jobs import QueueCache, Submission, cancel_job, enqueue_job, get_job_view
from inferq.shared.lifecycle import submit
from inferq.shared.rqjson import JSONJob, PickleRefused, check_rq_version, fetch_job, refuse_pickle
from inferq.shared.settings import Settings
from tests.support.counting import CountingConnection, counting_client


@pytest.fixture
def settings() -> Settings:
    return Settings(redis_url="redis://unused", result_ttl_s=100, queue_ttl_s=50, failure_ttl_s=200, job_timeout_s=100)


def test_enqueue_is_one_round_trip_and_writes_only_expiring_keys(
    redis: redis_py.Redis, redis_url: str, settings: Settings
) -> None:
    client = counting_client(redis_url)
    queues = QueueCache(client)
    enqueue_job(queues, settings, Submission("m", b"x", "image/png"))  # warms RQ's cached server version
    CountingConnection.sent = 0
    job = enqueue_job(queues, settings, Submission("m", b"payload", "image/png", webhook="http://h/", result_ttl_s=9))
    assert CountingConnection.sent == 1
    assert redis.get(keys.payload_key(job.id)) == b"payload"
    assert redis.lrange("rq:queue:inferq.m", 0, -1)[-1] == job.id.encode()
    for key in (keys.payload_key(job.id), keys.info_key(job.id), JSONJob.key_for(job.id)):
        assert redis.ttl(key) > 0, key
    assert redis.ttl(JSONJob.key_for(job.id)) <= settings.queue_ttl_s
    view = get_job_view(redis, job.id)
    assert view["status"] == "queued" and view["model"] == "m"
    assert view["webhook"] == {"url": "http://h/", "attempts": []}
    client.close()


def test_job_ids_are_unguessable_and_valid_for_rq(redis: redis_py.Redis, settings: Settings) -> None:
    queues = QueueCache(redis)
    ids = {enqueue_job(queues, settings, Submission("m", b"x", "image/png")).id for _ in range(50)}
    assert len(ids) == 50
    assert all(keys.JOB_ID_RE.match(i) and len(i) >= 22 for i in ids)


def test_view_of_unknown_or_odd_ids_is_not_found(redis: redis_py.Redis) -> None:
    for job_id in ("nope", "../etc", "a b", "x" * 500, "rq:job:1"):
        with pytest.raises(NotFound):
            get_job_view(redis, job_id)


def test_cancel_queued_then_again_is_conflict(redis: redis_py.Redis, settings: Settings) -> None:
    queues = QueueCache(redis)
    job = enqueue_job(queues, settings, Submission("m", b"x", "image/png"))
    cancel_job(queues, settings, job.id)
    assert get_job_view(redis, job.id)["status"] == "canceled"
    assert redis.llen("rq:queue:inferq.m") == 0
    assert redis.exists(keys.payload_key(job.id)) == 0
    assert 0 < redis.ttl(JSONJob.key_for(job.id)) <= settings.canceled_ttl_s
    with pytest.raises(Conflict):
        cancel_job(queues, settings, job.id)
    with pytest.raises(NotFound):
        cancel_job(queues, settings, "missing")


class _Boom:
    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (os.system, ("touch /tmp/inferq-pwned",))


def test_pickle_in_redis_is_never_loaded(redis: redis_py.Redis, settings: Settings, tmp_path: object) -> None:
    if os.path.exists("/tmp/inferq-pwned"):
        os.remove("/tmp/inferq-pwned")
    queues = QueueCache(redis)
    job = enqueue_job(queues, settings, Submission("m", b"x", "image/png"))
    gadget = pickle.dumps(_Boom())
    redis.hset(JSONJob.key_for(job.id), mapping={"data": gadget, "meta": gadget})
    fetched = fetch_job(job.id, redis)
    with pytest.raises(DeserializationError):
        _ = fetched.args  # the JSON serializer cannot read a pickle
    get_job_view(redis, job.id)
    refuse_pickle()
    with pytest.raises(PickleRefused):
        DefaultSerializer.loads(gadget)
    assert not os.path.exists("/tmp/inferq-pwned")


def test_the_canceled_registry_expires_with_the_jobs_it_names(
    redis: redis_py.Redis, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """200 cancels used to leave 200 members in a key without a TTL, long after every job expired."""
    short = settings.model_copy(update={"canceled_ttl_s": 2})
    queues = QueueCache(redis)
    first = [enqueue_job(queues, short, Submission("m", b"x", "image/png")).id for _ in range(20)]
    # The 20 cancels at one moment of the registry's clock: on a loaded machine they took over the 1 s TTL, and
    # a later cancel trimmed the earlier ones from the registry (as it should) before the count was read.
    at = submit.current_timestamp()
    monkeypatch.setattr(submit, "current_timestamp", lambda: at)
    for job_id in first:
        cancel_job(queues, short, job_id)
    monkeypatch.undo()
    registry = "rq:canceled:inferq.m"
    assert redis.zcard(registry) == 20
    assert 0 < redis.ttl(registry) <= 2
    time.sleep(4.1)  # the canceled jobs' own TTL passes
    assert redis.exists(registry) == 0
    assert [redis.exists(JSONJob.key_for(job_id)) for job_id in first] == [0] * 20
    later = enqueue_job(queues, settings, Submission("m", b"x", "image/png")).id
    cancel_job(queues, settings, later)
    assert redis.zrange(registry, 0, -1) == [later.encode()]
    assert 0 < redis.ttl(registry) <= settings.canceled_ttl_s


def test_the_rq_version_is_checked_against_the_layout_inferq_writes() -> None:
    check_rq_version()  # the installed one
    check_rq_version("2.12.0")
    for version in ("2.11.3", "3.0.0", "1.16.2"):
        with pytest.raises(ConfigError, match=rf"^rq {version} is installed; inferq writes RQ's storage layout"):
            check_rq_version(version)
