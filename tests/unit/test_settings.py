"""Settings as a process loads them: refused with one readable line, typos named, auth state logged."""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from inferq.api.app import create_app
from inferq.shared.errors import ConfigError
from inferq.shared.settings import Settings, get_settings

SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
SECRET_RULE = (
    "INFERQ_WEBHOOK_SECRET must be whsec_ followed by the key in base64 (Standard Webhooks),"
    " e.g. whsec_$(openssl rand -base64 32)"
)


@pytest.fixture(autouse=True)
def _clean_environment(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """No INFERQ_* variable from the shell running the tests leaks into these."""
    for name in list(os.environ):
        if name.upper().startswith("INFERQ_"):
            monkeypatch.delenv(name)
    yield


def load_error(monkeypatch: pytest.MonkeyPatch, **env: str) -> str:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(ConfigError) as raised:
        get_settings()
    return raised.value.message


# the webhook secret


@pytest.mark.parametrize(
    "secret",
    [
        SECRET.removeprefix("whsec_"),  # the bare base64 key: the usual mistake
        "whsec_",
        "whsec_not base64 at all!",
        "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaS",  # a character short: bad padding
        "sk_live_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
    ],
)
def test_a_webhook_secret_not_in_standard_webhooks_form_is_refused_at_load(
    monkeypatch: pytest.MonkeyPatch, secret: str
) -> None:
    message = load_error(monkeypatch, INFERQ_WEBHOOK_SECRET=secret)
    assert message == f"invalid settings: {SECRET_RULE}"


def test_a_standard_webhooks_secret_loads_and_an_empty_one_means_unsigned(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("INFERQ_WEBHOOK_SECRET", SECRET)
    secret = get_settings().webhook_secret
    assert secret is not None and secret.get_secret_value() == SECRET
    get_settings.cache_clear()
    # docker-compose.yml passes ${INFERQ_WEBHOOK_SECRET:-}: an empty value when the operator set none.
    monkeypatch.setenv("INFERQ_WEBHOOK_SECRET", "")
    assert get_settings().webhook_secret is None


# values and relationships


@pytest.mark.parametrize(
    ("env", "message"),
    [
        (
            {"INFERQ_WEBHOOK_RETRY_DELAYS_S": "[1, NaN, 30]"},
            "INFERQ_WEBHOOK_RETRY_DELAYS_S[1]: Input should be a finite number",
        ),
        (
            {"INFERQ_WEBHOOK_RETRY_DELAYS_S": "[1, Infinity]"},
            "INFERQ_WEBHOOK_RETRY_DELAYS_S[1]: Input should be a finite number",
        ),
        (
            {"INFERQ_WEBHOOK_RETRY_DELAYS_S": "[1, 5, -30]"},
            "INFERQ_WEBHOOK_RETRY_DELAYS_S[2]: Input should be greater than or equal to 0",
        ),
        (
            {"INFERQ_WEBHOOK_RETRY_DELAYS_S": "1,5,30"},
            "INFERQ_WEBHOOK_RETRY_DELAYS_S must be a JSON list of seconds, e.g. [1, 5, 30]",
        ),
        ({"INFERQ_MAX_WAIT_MS": "nan"}, "INFERQ_MAX_WAIT_MS: Input should be a finite number"),
        ({"INFERQ_MAX_WAIT_S": "inf"}, "INFERQ_MAX_WAIT_S: Input should be a finite number"),
        ({"INFERQ_WEBHOOK_TIMEOUT_S": "nan"}, "INFERQ_WEBHOOK_TIMEOUT_S: Input should be a finite number"),
        (
            {"INFERQ_MAX_WAIT_MS": "60001"},
            "INFERQ_MAX_WAIT_MS is 60001; it must be at most 60000: RQ fails a job that stays popped"
            " but unstarted for over a minute",
        ),
        (
            {"INFERQ_RESULT_TTL_S": "90000"},
            "INFERQ_RESULT_TTL_S (90000) is above INFERQ_MAX_RESULT_TTL_S (86400): the default must be"
            " a result_ttl a client may ask for",
        ),
        (
            {"INFERQ_MAX_RESULT_TTL_S": "60"},
            "INFERQ_RESULT_TTL_S (3600) is above INFERQ_MAX_RESULT_TTL_S (60): the default must be"
            " a result_ttl a client may ask for",
        ),
        (
            {"INFERQ_FAILURE_TTL_S": "10"},
            "INFERQ_FAILURE_TTL_S (10) is below INFERQ_JOB_TIMEOUT_S (300): a running job's record lives"
            " INFERQ_HEARTBEAT_TTL_S + INFERQ_FAILURE_TTL_S, so a shorter one can vanish mid-run",
        ),
        ({"INFERQ_PORT": "http"}, "INFERQ_PORT: Input should be a valid integer, unable to parse string as an integer"),
    ],
)
def test_nonsense_settings_are_refused_in_one_line(
    monkeypatch: pytest.MonkeyPatch, env: dict[str, str], message: str
) -> None:
    assert load_error(monkeypatch, **env) == f"invalid settings: {message}"


def test_every_error_is_named_on_the_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    message = load_error(monkeypatch, INFERQ_PORT="-1", INFERQ_MAX_WAIT_MS="nan")
    assert message == (
        "invalid settings: INFERQ_PORT: Input should be greater than or equal to 0;"
        " INFERQ_MAX_WAIT_MS: Input should be a finite number"
    )


def test_the_limits_themselves_are_accepted(monkeypatch: pytest.MonkeyPatch) -> None:
    env = {
        "INFERQ_MAX_WAIT_MS": "60000",
        "INFERQ_RESULT_TTL_S": "600",
        "INFERQ_MAX_RESULT_TTL_S": "600",
        "INFERQ_JOB_TIMEOUT_S": "30",
        "INFERQ_FAILURE_TTL_S": "30",
        "INFERQ_WEBHOOK_RETRY_DELAYS_S": "[0, 0.5, 2]",
    }
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    settings = get_settings()
    assert (settings.max_wait_ms, settings.result_ttl_s, settings.max_result_ttl_s) == (60000, 600, 600)
    assert (settings.job_timeout_s, settings.failure_ttl_s) == (30, 30)
    assert settings.webhook_retry_delays_s == [0, 0.5, 2]


def test_the_defaults_are_consistent() -> None:
    assert Settings() == get_settings()


# unknown INFERQ_* variables


def settings_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage() for r in caplog.records if r.name == "inferq.shared.settings" and r.levelno == logging.WARNING
    ]


def test_a_misspelt_variable_is_named_with_what_was_meant(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("INFERQ_API_KEY", "k-1")
    monkeypatch.setenv("INFERQ_RESULTS_TTL_S", "60")
    monkeypatch.setenv("INFERQ_FROBNICATE", "1")
    with caplog.at_level(logging.WARNING, logger="inferq.shared.settings"):
        settings = get_settings()
    assert settings.api_keys == [] and settings.result_ttl_s == 3600
    assert settings_warnings(caplog) == [
        "INFERQ_API_KEY is not an inferq setting and is ignored; did you mean INFERQ_API_KEYS?",
        "INFERQ_FROBNICATE is not an inferq setting and is ignored",
        "INFERQ_RESULTS_TTL_S is not an inferq setting and is ignored; did you mean INFERQ_RESULT_TTL_S?",
    ]
    assert all("k-1" not in r.getMessage() for r in caplog.records)


def test_names_used_outside_settings_are_not_warned_about(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # INFERQ_LOG_LEVEL: read by inferq/cli.py before logging exists; INFERQ_TEST_*: the test models'.
    for name in ("INFERQ_LOG_LEVEL", "INFERQ_TEST_SLOW_S", "INFERQ_REDIS_URL", "inferq_port"):
        monkeypatch.setenv(name, "1" if name != "INFERQ_REDIS_URL" else "redis://127.0.0.1:1/0")
    with caplog.at_level(logging.WARNING, logger="inferq.shared.settings"):
        settings = get_settings()
    assert settings.port == 1
    assert settings_warnings(caplog) == []


# the API says whether it authenticates, and which routes it leaves open
OPEN = (
    "/healthz, /readyz, /v2/health/live, /v2/health/ready, /v2, /metrics, /docs, /docs/oauth2-redirect, /redoc,"
    " /openapi.json, /static-offline-docs/*, /, /static/*"
)


@pytest.mark.parametrize(
    ("api_keys", "line"),
    [
        (
            ["key-a", "key-b"],
            "API-key authentication is on: 2 keys (INFERQ_API_KEYS); operators: none (no key may change a rollout);"
            f" open without one: {OPEN}",
        ),
        (
            ["key-a"],
            "API-key authentication is on: 1 key (INFERQ_API_KEYS); operators: none (no key may change a rollout);"
            f" open without one: {OPEN}",
        ),
        (
            [],
            "API-key authentication is off: INFERQ_API_KEYS is not set, anyone who can reach the API may use it and"
            " act as its operator (rollouts, reloads): keep it on loopback or a private network",
        ),
    ],
)
def test_the_api_logs_at_start_whether_it_authenticates(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, api_keys: list[str], line: str
) -> None:
    settings = Settings(redis_url="redis://127.0.0.1:1/0", models_dir=tmp_path, api_keys=api_keys)
    with caplog.at_level(logging.INFO, logger="inferq.api.app"):
        create_app(settings)
    assert [(r.levelno, r.getMessage()) for r in caplog.records if r.name == "inferq.api.app"] == [(logging.INFO, line)]
    assert all("key-" not in r.getMessage() for r in caplog.records)


def test_the_api_binds_loopback_unless_told(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Without keys anyone who reaches the API is its operator: `inferq up` and `inferq api` bind 127.0.0.1 unless
    INFERQ_HOST or --host says otherwise (docs/operating.md)."""
    monkeypatch.delenv("INFERQ_HOST", raising=False)
    assert Settings(redis_url="redis://127.0.0.1:1/0", models_dir=tmp_path).host == "127.0.0.1"
