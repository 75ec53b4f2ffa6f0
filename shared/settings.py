"""One Settings object for every process, read from ``INFERQ_*`` environment variables."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Annotated

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict


class Settings(BaseSettings):
    """Configuration shared by the API, the workers and the CLI; CLI flags override it."""

    model_config = SettingsConfigDict(env_prefix="INFERQ_", extra="ignore")

    # None: `inferq up` starts a private redis-server and exports its URL to its children.
    redis_url: str | None = None
    host: str = "127.0.0.1"
    port: int = Field(default=8000, ge=0, le=65535)
    models_dir: Path = Path("models")
    data_dir: Path = Path(".inferq")

    result_ttl_s: int = Field(default=3600, ge=1)
    max_result_ttl_s: int = Field(default=86400, ge=1)
    failure_ttl_s: int = Field(default=86400, ge=1)
    # How long a job may wait in its queue before RQ drops it; also bounds its payload's life.
    queue_ttl_s: int = Field(default=3600, ge=1)
    job_timeout_s: int = Field(default=300, ge=1)
    canceled_ttl_s: int = Field(default=3600, ge=1)

    # Past this many waiting jobs a model's submits answer 429 (models may set max_queue_length).
    max_queue_length: int = Field(default=10000, ge=1)
    idempotency_ttl_s: int = Field(default=86400, ge=1)
    # Bearer tokens, comma-separated; empty: no authentication.
    api_keys: Annotated[list[str], NoDecode] = Field(default_factory=list)
    cors_origins: Annotated[list[str], NoDecode] = Field(default_factory=list)
    # Webhook targets allowed although private or loopback: hostnames or CIDRs, comma-separated.
    webhook_allow: Annotated[list[str], NoDecode] = Field(default_factory=list)
    max_body_bytes: int = Field(default=10 * 1024 * 1024, ge=1024)
    max_image_pixels: int = Field(default=40_000_000, ge=1)
    max_wait_s: float = Field(default=60.0, ge=0)

    webhook_secret: SecretStr | None = None
    webhook_timeout_s: float = Field(default=10.0, gt=0)
    # Delays before attempt 2, 3, ...: the schedule the README documents.
    webhook_retry_delays_s: list[float] = Field(default=[1, 5, 30, 120, 600, 1800])
    webhook_ttl_s: int = Field(default=86400, ge=1)

    # Worker side; `inferq worker` flags override these.
    device: str = "auto"
    max_batch: int | None = Field(default=None, ge=1)
    max_wait_ms: float = Field(default=0.0, ge=0)
    worker_ttl_s: int = Field(default=30, ge=16)
    # A batch's jobs stay in RQ's started registry this long past the last heartbeat (sent every
    # third of it); then any worker's maintenance, every maintenance_interval_s, retries them.
    # Together they bound how long a killed worker's jobs wait: under a minute with these.
    heartbeat_ttl_s: int = Field(default=20, ge=3)
    maintenance_interval_s: int = Field(default=15, ge=1)
    # How often a job is retried when the worker running it dies (models may override).
    job_retries: int = Field(default=2, ge=0, le=10)

    @field_validator("api_keys", "cors_origins", "webhook_allow", mode="before")
    @classmethod
    def _comma_list(cls, value: object) -> object:
        if isinstance(value, str):
            return [part.strip() for part in value.split(",") if part.strip()]
        return value


@lru_cache
def get_settings() -> Settings:
    """The process's settings, read once; tests clear the cache to override."""
    return Settings()
