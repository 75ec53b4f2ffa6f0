"""INFERQ_TENANTS as a new user writes it: inline or from a file, each key kept as its SHA-256 only, and every
mistake told in one line that never repeats a key."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from inferq.shared.errors import ConfigError
from inferq.shared.settings import Settings
from inferq.shared.tenants import Tenants, parse_tenants


def test_tenants_come_inline_or_from_a_file_and_each_api_key_is_one_of_weight_1(tmp_path: Path) -> None:
    spec = [{"name": "acme", "key": "s3cret", "weight": 3, "quotas": {"jobs_per_minute": 100}}]
    (tmp_path / "t.json").write_text(json.dumps(spec))
    for raw in (json.dumps(spec), f"@{tmp_path / 't.json'}"):
        acme, plain = parse_tenants(raw, ["other"])
        assert (acme.name, acme.weight, acme.quotas.jobs_per_minute) == ("acme", 3.0, 100)
        assert acme.key_sha256 == hashlib.sha256(b"s3cret").hexdigest()
        assert "s3cret" not in repr(acme)
        assert (plain.name, plain.weight) == ("key-" + hashlib.sha256(b"other").hexdigest()[:8], 1.0)
    found = Tenants(parse_tenants(json.dumps(spec), []))
    assert found.of_key("s3cret") is not None and found.of_key("s3cret ") is None and found.of_key("") is None


def test_only_a_tenant_marked_operator_is_one_and_no_key_of_inferq_api_keys_is() -> None:
    spec = [{"name": "ops", "key": "k1", "operator": True}, {"name": "acme", "key": "k2"}]
    ops, acme, plain = parse_tenants(json.dumps(spec), ["k3"])
    assert (ops.operator, acme.operator, plain.operator) == (True, False, False)
    assert Tenants([ops, acme, plain]).operators == [ops]


def test_a_key_given_as_its_sha256_is_checked_as_the_key_itself() -> None:
    digest = hashlib.sha256(b"k").hexdigest().upper()
    (tenant,) = parse_tenants(json.dumps([{"name": "t", "key_sha256": digest}]))
    assert Tenants([tenant]).of_key("k") == tenant


@pytest.mark.parametrize(
    ("spec", "told"),
    [
        ([{"name": "a"}], "give the tenant's key or its key_sha256"),
        ([{"name": "a", "key": "s3cret", "key_sha256": "0" * 64}], "give the tenant's key or its key_sha256"),
        ([{"name": "a b", "key": "s3cret"}], "0.name"),
        ([{"name": "default", "key": "s3cret"}], "kept for the jobs of a deployment without tenants"),
        ([{"name": "a", "key": "s3cret", "weight": 0}], "0.weight"),
        ([{"name": "a", "key": "s3cret", "quotas": {"jobs_per_minute": 0}}], "jobs_per_minute"),
        ([{"name": "a", "key": "s3cret", "quotas": {"bulk_lines": -1}}], "bulk_lines"),
        ([{"name": "a", "key": "s3cret", "quotas": {"in_flight": 0}}], "in_flight"),
        ([{"name": "a", "key": "s3cret", "extra": 1}], "0.extra"),
        ([{"name": "a", "key": "s3cret", "operator": "false"}], "0.operator"),  # a role is JSON's true or false
        ([{"name": "a", "key": "s3cret"}, {"name": "a", "key": "other"}], "more than once: ['a']"),
        ([{"name": "a", "key": "s3cret"}, {"name": "b", "key": "s3cret"}], "share one key"),
        ({"name": "a", "key": "s3cret"}, "valid list"),
    ],
)
def test_a_bad_tenants_setting_is_one_line_that_never_repeats_a_key(spec: object, told: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_tenants(json.dumps(spec))
    assert told in caught.value.message and "s3cret" not in caught.value.message


def test_unreadable_or_broken_tenants_say_where(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot be read"):
        parse_tenants(f"@{tmp_path / 'missing.json'}")
    with pytest.raises(ConfigError, match="is not JSON") as caught:
        parse_tenants('[{"name": "a", "key": "s3cret"')
    assert "s3cret" not in caught.value.message


def test_settings_check_the_tenants_and_never_show_them(tmp_path: Path) -> None:
    raw = json.dumps([{"name": "a", "key": "s3cret"}])
    settings = Settings(redis_url="redis://127.0.0.1:1/0", models_dir=tmp_path, tenants=raw)
    assert [t.name for t in settings.tenant_list] == ["a"]
    assert "s3cret" not in repr(settings)
    with pytest.raises(ValueError, match="give the tenant's key"):
        Settings(redis_url="redis://127.0.0.1:1/0", models_dir=tmp_path, tenants='[{"name": "a"}]')
