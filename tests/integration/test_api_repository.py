"""The API's model repository as it changes under it, and the rollouts stored beside it (httpx.ASGITransport, the
session's redis-server): a config that turns invalid, a version that leaves, a rollout that cannot be used."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis as redis_py

from inferq.api.app import create_app
from inferq.shared import keys, versions
from inferq.shared.lifecycle import layout
from inferq.shared.settings import Settings

TENSOR = {"kind": "tensor", "shape": [2], "dtype": "float32"}
Client = httpx.AsyncClient


def write_model(models: Path, name: str, numbered: tuple[int, ...] = (2,)) -> Path:
    """A model laid out as the README's rollout leaves digits: version 1's weights beside its config, and a folder
    per ``numbered`` version (the API never loads weights: empty files do)."""
    folder = models / name
    folder.mkdir(parents=True)
    config = {"handler": "tensor", "format": "export", "weights": "model.pt2", "input": TENSOR}
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "model.pt2").write_bytes(b"")
    for version in numbered:
        (folder / str(version)).mkdir()
        (folder / str(version) / "model.pt2").write_bytes(b"")
    return folder


def run_app(settings: Settings, steps: Callable[[Client], Awaitable[None]]) -> None:
    """``steps`` against one app, its lifespan (Redis, event hub, the repository's watcher) running around them."""

    async def run() -> None:
        app = create_app(settings)
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app)
            async with Client(transport=transport, base_url="http://inferq", timeout=30) as client:
                await steps(client)

    asyncio.run(run())


def serve(redis: redis_py.Redis, served: str) -> None:
    """What a live worker leaves for the API to see: its hash, its name in the queue's worker set, its version's
    told state (ready, since now)."""
    worker = f"rq:worker:fake-{served}"
    redis.hset(worker, mapping={"queues": keys.queue_name(served), "state": "idle"})
    redis.sadd(layout.workers_key(keys.queue_name(served)), worker)
    versions.tell(redis, served, "ready")


async def until(predicate: Callable[[], bool], what: str, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.05)


def said(caplog: pytest.LogCaptureFixture, fragment: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if fragment in r.getMessage()]


@pytest.fixture
def models(tmp_path: Path) -> Path:
    return tmp_path / "models"


def test_a_config_that_turns_invalid_keeps_serving_its_last_good_config_and_says_why(
    models: Path, redis: redis_py.Redis, redis_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The audit's trailing comma: 21 of 24 submits answered 404 while the config.json of a serving model was
    invalid for 6 s."""
    folder = write_model(models, "scale")
    good = (folder / "config.json").read_text()
    broken = good.replace("}}", "},}")  # the trailing comma
    try:
        json.loads(broken)
    except ValueError as exc:
        error = f"{folder / 'config.json'}: {exc}"
    caplog.set_level(logging.INFO)

    async def steps(client: Client) -> None:
        (folder / "config.json").write_text(broken)
        reloaded = await client.post("/v1/models/reload")
        assert reloaded.json() == {"added": [], "removed": [], "changed": [], "invalid": ["scale", "scale@2"]}
        for version in (None, 1, 2):
            params = {} if version is None else {"version": version}
            submitted = await client.post("/v1/models/scale/jobs", json={"inputs": [1, 2]}, params=params)
            assert submitted.status_code == 202, submitted.text
        listing = (await client.get("/v1/models")).json()
        assert [(v["version"], v["state"]) for v in listing["models"][0]["versions"]] == [
            (1, "unavailable"),
            (2, "unavailable"),
        ]
        assert listing["invalid"] == [
            {"name": "scale", "error": error, "serving": True},
            {"name": "scale@2", "error": error, "serving": True},
        ]
        assert (await client.get("/readyz")).json()["invalid_models"] == ["scale", "scale@2"]
        (folder / "config.json").write_text(good)
        reloaded = await client.post("/v1/models/reload")
        assert reloaded.json() == {"added": [], "removed": [], "changed": [], "invalid": []}
        assert (await client.get("/v1/models")).json()["invalid"] == []

    run_app(Settings(redis_url=redis_url, models_dir=models, models_poll_s=0), steps)
    assert said(caplog, "its config is invalid now") == [
        f"model scale v1: its config is invalid now ({error}); the config it had before serves until it is fixed",
        f"model scale v2: its config is invalid now ({error}); the config it had before serves until it is fixed",
    ]
    queued = [redis.llen(layout.queue_keys(keys.queue_name(s)).queue) for s in ("scale", "scale@2")]
    assert queued == [1, 2]  # pinned to 1; pinned to 2, and unpinned (no version serves: the highest)


def test_retiring_version_1_while_version_2_serves_names_the_version_in_every_log_line(
    models: Path, redis: redis_py.Redis, redis_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The audit read "removed ['digits']" and "model digits: removed from the repository and drained: no worker
    serves it" while version 2 of digits served every submit."""
    folder = write_model(models, "scale")
    caplog.set_level(logging.INFO)

    async def steps(client: Client) -> None:
        (folder / "model.pt2").unlink()  # the README's retirement of version 1
        await until(lambda: bool(said(caplog, "drained: no worker serves it")), "the version's drain to be told")
        assert [v["version"] for v in (await client.get("/v1/models/scale")).json()["versions"]] == [2]

    run_app(Settings(redis_url=redis_url, models_dir=models, models_poll_s=0.1), steps)
    assert said(caplog, "model repository changed") == ["model repository changed: removed scale v1"]
    assert said(caplog, "drained") == ["model scale v1: removed from the repository and drained: no worker serves it"]


def test_a_rollout_set_through_the_api_leaves_with_the_versions_it_names(
    models: Path, redis: redis_py.Redis, redis_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The README's "puts the demo back" (version 2's folder removed) left its ramp for version 2 listed and in force;
    a rollout naming a version not there yet keeps waiting for it."""
    folder = write_model(models, "scale")
    write_model(models, "other", numbered=())
    caplog.set_level(logging.INFO)
    ramp = {"version": 2, "steps": [50, 100], "interval_s": 30}

    async def steps(client: Client) -> None:
        put = await client.put("/v1/models/scale/rollout", json={"traffic": {"1": 90, "2": 10}, "ramp": ramp})
        assert put.status_code == 200 and put.json()["rollout"]["set_by"] == "api", put.text
        early = await client.put("/v1/models/other/rollout", json={"traffic": {"1": 90, "2": 10}})
        assert early.status_code == 200, early.text
        for path in sorted((folder / "2").iterdir()):
            path.unlink()
        (folder / "2").rmdir()
        reloaded = await client.post("/v1/models/reload")
        assert reloaded.json()["removed"] == ["scale@2"]
        scale = (await client.get("/v1/models/scale")).json()
        assert scale["rollout"] == {
            "traffic": None,
            "ramp": None,
            "set_by": "config",
            "ramp_started_at": None,
            "unusable": None,
        }
        other = (await client.get("/v1/models/other")).json()
        assert (other["rollout"]["set_by"], other["rollout"]["traffic"]) == ("api", {"1": 90.0, "2": 10.0})

    run_app(Settings(redis_url=redis_url, models_dir=models, models_poll_s=0), steps)
    assert not redis.exists(keys.rollout_key("scale")) and redis.exists(keys.rollout_key("other"))
    assert said(caplog, "left the repository: cleared") == [
        "model scale: its rollout set through the API named version 2, which left the repository: cleared, its "
        "config.json's holds"
    ]


@pytest.mark.parametrize(
    ("body", "error"),
    [
        ({"ramp": {"version": 2, "steps": [10, 100], "interval_s": 5e-324}}, "greater than or equal to 1"),
        ({"ramp": {"version": 2, "steps": [10, 100], "interval_s": 0.5}}, "greater than or equal to 1"),
        ({"ramp": {"version": 2, "steps": [10, 100], "interval_s": 86_401}}, "less than or equal to 86400"),
        ({"ramp": {"version": 2, "steps": [10, 101]}}, "less than or equal to 100"),
        ({"ramp": {"version": 2, "steps": [10] * 101}}, "at most 100 items"),
        ({"ramp": {"version": 1_000_000_000, "steps": [10]}}, "less than or equal to 999999999"),
        ({"traffic": {str(v): 1 for v in range(1, 102)}}, "at most 100 items"),
    ],
)
def test_rollout_numbers_past_their_bounds_are_refused_before_anything_is_stored(
    models: Path, redis: redis_py.Redis, redis_url: str, body: dict[str, Any], error: str
) -> None:
    """A ramp with interval_s 5e-324 was taken (gt=0), and every unpinned submit and GET /v1/models then answered
    500 for as long as it stood."""
    write_model(models, "scale")

    async def steps(client: Client) -> None:
        refused = await client.put("/v1/models/scale/rollout", json=body)
        assert refused.status_code == 422, refused.text
        assert error in refused.json()["error"]["message"], refused.text

    run_app(Settings(redis_url=redis_url, models_dir=models, models_poll_s=0), steps)
    assert not redis.exists(keys.rollout_key("scale"))


def test_a_stored_rollout_that_cannot_be_used_is_ignored_and_shown_never_a_500(
    models: Path, redis: redis_py.Redis, redis_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The ramp stored before the bounds were checked (its TTL renewed by every read): the config's rollout holds,
    the listing says why, a line in the log says it once, and DELETE clears it."""
    write_model(models, "scale")
    serve(redis, "scale")
    serve(redis, "scale@2")
    ramp = {"version": 2, "steps": [10, 100], "interval_s": 5e-324}
    redis.set(keys.rollout_key("scale"), json.dumps({"traffic": None, "ramp": ramp, "at": time.time() - 60}))
    unusable = "ramp.interval_s: Input should be greater than or equal to 1 (got 5e-324)"
    caplog.set_level(logging.INFO)

    async def steps(client: Client) -> None:
        listed = await client.get("/v1/models/scale")
        assert listed.status_code == 200, listed.text
        assert listed.json()["rollout"] == {
            "traffic": None,
            "ramp": None,
            "set_by": "config",
            "ramp_started_at": None,
            "unusable": unusable,
        }
        for _ in range(3):
            submitted = await client.post("/v1/models/scale/jobs", json={"inputs": [1, 2]})
            assert (submitted.status_code, submitted.json()["version"]) == (202, 2), submitted.text
        assert (await client.get("/v1/models")).status_code == 200
        cleared = await client.delete("/v1/models/scale/rollout")
        assert cleared.status_code == 200 and cleared.json()["rollout"]["unusable"] is None

    run_app(Settings(redis_url=redis_url, models_dir=models, models_poll_s=0), steps)
    assert said(caplog, "cannot be used") == [
        f"model scale: its rollout set through the API cannot be used ({unusable}); its config.json's holds until "
        "DELETE /v1/models/scale/rollout clears it"
    ]
    assert not redis.exists(keys.rollout_key("scale"))
