"""A model's versions: the repository's numbered folders, served names, and how unpinned submits are shared."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from inferq.api.versions import pick, shares_of
from inferq.shared.keys import model_from_queue, queue_name, served_name, split_served
from inferq.shared.models import ModelConfig, Rollout, load_model_configs, repository_signature, weights_sha256

TENSOR = {"handler": "tensor", "input": {"kind": "tensor", "shape": [2]}, "weights": "w.bin"}


def write(folder: Path, config: dict[str, Any] | None = None, weights: bytes | None = None) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    if config is not None:
        (folder / "config.json").write_text(json.dumps(config))
    if weights is not None:
        (folder / "w.bin").write_bytes(weights)


def test_served_names_leave_version_1_as_it_was() -> None:
    assert served_name("m", 1) == "m" and served_name("m", 12) == "m@12"
    assert split_served("m") == ("m", 1) and split_served("m@12") == ("m", 12)
    assert split_served("m@²") == ("m", 1)  # str.isdigit() is true of "²", which int() refuses
    assert queue_name("m@2", "bulk") == "inferq.m@2.bulk" and model_from_queue("inferq.m@2.bulk") == "m@2"


def test_numbered_folders_are_versions_each_with_its_overrides(tmp_path: Path) -> None:
    write(tmp_path / "plain", TENSOR, b"x")
    write(tmp_path / "m", {**TENSOR, "max_batch": 8, "rollout": {"traffic": {"1": 90, "2": 10}}})
    write(tmp_path / "m" / "1", weights=b"one")
    write(tmp_path / "m" / "2", {"max_batch": 64, "version": 7}, b"two")
    write(tmp_path / "m" / "3", {"rollout": {"traffic": {"3": 100}}}, b"three")  # a version may not set it
    write(tmp_path / "m" / "notes")  # not a number: not a version
    repo = load_model_configs(tmp_path)
    assert sorted(repo) == ["m", "m@2", "plain"]
    assert repo.models() == ["m", "plain"] and list(repo.versions("m")) == [1, 2]
    one, two = repo["m"], repo["m@2"]
    assert (one.version, one.max_batch, one.path) == (1, 8, tmp_path / "m" / "1")
    assert (two.version, two.max_batch, two.served) == (2, 64, "m@2")  # its own "version" field is ignored
    assert two.rollout == Rollout(traffic={1: 90, 2: 10})  # the model's, on every version
    assert "rollout is the model's" in repo.invalid["m@3"]
    assert (repo["plain"].version, repo["plain"].path) == (1, tmp_path / "plain")
    assert weights_sha256(one) != weights_sha256(two)


def test_the_weights_beside_the_config_stay_version_1_when_a_version_2_is_added(tmp_path: Path) -> None:
    """A rollout starts with one new folder: the weights that serve today stay version 1 until they are removed."""
    write(tmp_path / "m", TENSOR, b"today")
    before = repository_signature(tmp_path)
    write(tmp_path / "m" / "2", weights=b"new")
    repo = load_model_configs(tmp_path)
    assert sorted(repo) == ["m", "m@2"]
    assert (repo["m"].path, repo["m@2"].path) == (tmp_path / "m", tmp_path / "m" / "2")
    with_two = repository_signature(tmp_path)
    assert with_two != before
    (tmp_path / "m" / "w.bin").unlink()  # version 1 retired: its weights removed
    assert sorted(load_model_configs(tmp_path)) == ["m@2"]
    assert repository_signature(tmp_path) != with_two  # the API reads the repository again
    write(tmp_path / "m", weights=b"back")
    write(tmp_path / "m" / "1", weights=b"one")  # a 1/ folder is version 1: the weights beside the config are not
    assert load_model_configs(tmp_path)["m"].path == tmp_path / "m" / "1"


def test_a_models_versions_must_share_its_redis(tmp_path: Path) -> None:
    write(tmp_path / "m", TENSOR)
    write(tmp_path / "m" / "1", weights=b"one")
    write(tmp_path / "m" / "2", {"redis": "other"}, b"two")
    repo = load_model_configs(tmp_path, redis_shards=("other",))
    assert not repo and "must use one Redis" in repo.invalid["m"]


@pytest.mark.parametrize("bad", [{"1": -1}, {"0": 100}, {"1": 0}])
def test_traffic_takes_positive_versions_and_shares(bad: dict[str, float]) -> None:
    with pytest.raises(ValueError, match="traffic"):
        Rollout.model_validate({"traffic": bad})


def versions(traffic: dict[int, float] | None, numbers: tuple[int, ...] = (1, 2, 3)) -> dict[int, ModelConfig]:
    rollout = Rollout(traffic=traffic) if traffic else None
    return {n: ModelConfig.model_validate({**TENSOR, "name": "m", "version": n, "rollout": rollout}) for n in numbers}


def test_shares_count_only_serving_versions() -> None:
    assert shares_of(versions(None), {1, 2}) == {2: 1.0}  # latest that serves
    assert shares_of(versions(None), set()) == {3: 1.0}  # none serves: the latest waits for its worker
    split = versions({1: 90, 2: 10})
    assert shares_of(split, {1, 2, 3}) == {1: 90, 2: 10}
    assert shares_of(split, {1}) == {1: 90}  # version 2 failed: version 1 takes its share
    assert shares_of(split, {3}) == {3: 1.0}  # only an unlisted version serves: better than waiting
    assert shares_of(split, set()) == {1: 90, 2: 10}


@pytest.mark.parametrize(
    ("shares", "n"), [({1: 90, 2: 10}, 5000), ({1: 1, 2: 1, 3: 1}, 999), ({1: 99.5, 2: 0.5}, 2000)]
)
def test_the_split_is_exact_within_a_job_or_two_at_every_point(shares: dict[int, float], n: int) -> None:
    total = sum(shares.values())
    counts: Counter[int] = Counter()
    for i in range(1, n + 1):
        counts[pick(shares, i)] += 1
        if i % 50 == 0:  # not only at the end: at every point along the way
            assert all(abs(counts[v] - i * s / total) <= 3 for v, s in shares.items()), (i, counts)


def test_a_rolled_back_version_gives_its_share_to_the_others() -> None:
    split = versions({1: 90, 2: 10})
    assert shares_of(split, {1, 2}, {2}) == {1: 90}  # the previous version takes the traffic
    assert shares_of(versions(None), {1, 2, 3}, {3}) == {2: 1.0}  # "latest" falls back to the next one down
    assert shares_of(split, {2}, {2}) == {2: 10}  # nothing else serves: the rollback is set aside, not the jobs
    assert shares_of(split, set(), {1}) == {2: 10}  # a cold start queues for the versions not rolled back


def ramped(steps: list[float], traffic: dict[int, float] | None = None) -> dict[int, ModelConfig]:
    rollout = Rollout(traffic=traffic, ramp={"version": 2, "steps": steps, "interval_s": 60})
    return {n: ModelConfig.model_validate({**TENSOR, "name": "m", "version": n, "rollout": rollout}) for n in (1, 2)}


def test_a_ramp_steps_its_version_up_from_when_it_first_served() -> None:
    model = ramped([10, 50, 100])
    assert shares_of(model, {1}, set(), None) == {1: 1.0}  # not serving yet: none for it
    assert shares_of(model, {1, 2}, set(), 0.0) == pytest.approx({2: 0.1, 1: 0.9})
    assert shares_of(model, {1, 2}, set(), 61.0) == pytest.approx({2: 0.5, 1: 0.5})
    assert shares_of(model, {1, 2}, set(), 3600.0) == {2: 1.0}  # the last step holds
    assert shares_of(model, {1, 2}, {2}, 0.0) == {1: 1.0}  # rolled back: the ramp stops
    assert shares_of(model, {2}, set(), 0.0) == {2: 1.0}  # alone: it takes everything
    split = ramped([20], traffic={1: 100})
    assert shares_of(split, {1, 2}, set(), 5.0) == pytest.approx({2: 0.2, 1: 0.8})


@pytest.mark.parametrize("steps", [[], [120], [-1]])
def test_ramp_steps_are_percentages(steps: list[float]) -> None:
    with pytest.raises(ValueError, match="steps|at least 1"):
        Rollout.model_validate({"ramp": {"version": 2, "steps": steps}})


@pytest.mark.parametrize(
    ("body", "taken"),
    [
        ({"traffic": {"1": 90, "2": 10}}, True),
        ({"ramp": {"version": 2, "steps": [10, 100]}}, True),
        ({"traffic": {}}, False),
        ({"traffic": {"0": 50}}, False),
        ({"traffic": {"1": 0}}, False),
        ({"traffic": None}, False),
        ({}, False),
    ],
)
def test_the_rollout_schema_admits_exactly_what_the_api_takes(body: dict[str, Any], taken: bool) -> None:
    """A client (or schemathesis) that trusts /openapi.json sends nothing the API refuses, and vice versa."""
    jsonschema = pytest.importorskip("jsonschema")
    from pydantic import ValidationError

    from inferq.api.routers.models import RolloutUpdate

    admitted = jsonschema.Draft202012Validator(RolloutUpdate.model_json_schema()).is_valid(body)
    try:
        RolloutUpdate.model_validate(body)
        accepted = True
    except ValidationError:
        accepted = False
    assert (admitted, accepted) == (taken, taken)
