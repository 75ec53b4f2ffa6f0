"""Tenants: the API keys a deployment takes, each with a name, a weight and optional quotas.

``INFERQ_TENANTS`` configures them: a JSON list, inline or ``@/path/to/file.json`` (a Kubernetes Secret mounted as
a file), of ``{"name": …, "key": … or "key_sha256": …, "weight": 1, "quotas": {…}, "operator": false}``. Each key
of ``INFERQ_API_KEYS`` is a tenant too, of weight 1, named ``key-`` and the first 8 hex digits of its SHA-256, and no
operator. With neither, there is one tenant, ``default``, and nothing is checked.

An operator (``"operator": true``) is a tenant that may also change what every tenant gets (a model's rollout, a
version's restore, a reload of the repository) and see every tenant (the status page, /metrics' tenant label); any
other key sees and changes only its own (api/auth.py ``may_operate``).

Only a key's SHA-256 is kept: a request's key is hashed and compared with each stored hash in constant time. A key
is never logged, shown or stored in Redis (a job records its owner as the first 32 hex digits of that hash).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    StrictBool,
    TypeAdapter,
    ValidationError,
    model_validator,
)

from inferq.shared.errors import ConfigError

NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
DEFAULT = "default"


class Quotas(BaseModel):
    """A tenant's limits; one left out is not limited."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    # Jobs accepted per minute, over every API process: a burst of this many at once, then one every 60/N s.
    jobs_per_minute: int | None = Field(default=None, ge=1)
    # Jobs submitted (REST and /v2) and not yet ended, over every API process.
    in_flight: int | None = Field(default=None, ge=1)
    # Lines of its uploads (bulk batches, either lane) still waiting to run, over every API process.
    bulk_lines: int | None = Field(default=None, ge=1)


class TenantSpec(BaseModel):
    """One entry of INFERQ_TENANTS."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=NAME_RE.pattern)
    key: SecretStr | None = Field(default=None, min_length=1)
    key_sha256: str | None = Field(default=None, pattern=r"^[0-9a-fA-F]{64}$")
    weight: float = Field(default=1.0, gt=0, le=1000)
    quotas: Quotas = Quotas()
    # Whether its key may also act on every tenant's service and see every tenant: only JSON's true or false, so a
    # quoted "false" is refused rather than read as a role.
    operator: StrictBool = False

    @model_validator(mode="after")
    def _one_key(self) -> TenantSpec:
        if (self.key is None) == (self.key_sha256 is None):
            raise ValueError("give the tenant's key or its key_sha256, one of the two")
        return self


@dataclass(frozen=True)
class Tenant:
    name: str
    key_sha256: str  # hex, lower case; empty for the keyless default tenant
    weight: float = 1.0
    quotas: Quotas = Quotas()
    operator: bool = False  # its key may change every tenant's routing and see every tenant (TenantSpec.operator)

    @property
    def owner(self) -> str | None:
        """What its jobs record as their owner (only it may read or cancel them); None without keys."""
        return self.key_sha256[:32] if self.key_sha256 else None


ANYONE = Tenant(DEFAULT, "")


def key_sha256(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def _read(raw: str) -> Any:
    text = raw.strip()
    where = "INFERQ_TENANTS"
    if text.startswith("@"):
        path = Path(text[1:]).expanduser()
        where = f"INFERQ_TENANTS file {path}"
        try:
            text = path.read_text()
        except OSError as exc:
            raise ConfigError(f"{where} cannot be read: {exc.strerror or exc}") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        # The position, never the text: it may hold keys.
        raise ConfigError(f"{where} is not JSON ({exc.msg} at line {exc.lineno}, column {exc.colno})") from None


_SPECS = TypeAdapter(list[TenantSpec])


def parse_tenants(raw: str | None, api_keys: Iterable[str] = ()) -> list[Tenant]:
    """The configured tenants (INFERQ_TENANTS, then each key of INFERQ_API_KEYS); [] when there are none."""
    specs: list[TenantSpec] = []
    if raw and raw.strip():
        try:
            specs = _SPECS.validate_python(_read(raw))
        except ValidationError as exc:
            # Each error's place and message; never its input (a key).
            told = "; ".join(
                f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" if e["loc"] else e["msg"] for e in exc.errors()
            )
            raise ConfigError(f"INFERQ_TENANTS is invalid: {told}") from None
    tenants = [
        Tenant(
            s.name,
            key_sha256(s.key.get_secret_value()) if s.key is not None else str(s.key_sha256).lower(),
            s.weight,
            s.quotas,
            s.operator,
        )
        for s in specs
    ]
    for key in api_keys:
        digest = key_sha256(key)
        tenants.append(Tenant(f"key-{digest[:8]}", digest))
    if any(t.name == DEFAULT for t in tenants):
        raise ConfigError(f"INFERQ_TENANTS: the name {DEFAULT!r} is kept for the jobs of a deployment without tenants")
    names = [t.name for t in tenants]
    if len(set(names)) != len(names):
        twice = sorted({n for n in names if names.count(n) > 1})
        raise ConfigError(f"INFERQ_TENANTS names a tenant more than once: {twice}")
    digests = [t.key_sha256 for t in tenants]
    if len(set(digests)) != len(digests):
        twice = sorted({t.name for t in tenants if digests.count(t.key_sha256) > 1})
        raise ConfigError(f"tenants {twice} share one key (INFERQ_TENANTS or INFERQ_API_KEYS)")
    return tenants


class Tenants:
    """The tenants a request's key is checked against."""

    def __init__(self, tenants: list[Tenant]) -> None:
        self.all = tenants
        self.by_name = {t.name: t for t in tenants}
        self._digests = [(t.key_sha256.encode(), t) for t in tenants]

    @property
    def operators(self) -> list[Tenant]:
        return [t for t in self.all if t.operator]

    @property
    def required(self) -> bool:
        """Whether a request needs a key: no tenants configured means one open tenant."""
        return bool(self.all)

    def of_key(self, given: str) -> Tenant | None:
        """The tenant whose key this is, or None; every stored hash compared in constant time."""
        digest = key_sha256(given).encode()
        found = None
        for stored, tenant in self._digests:
            if hmac.compare_digest(digest, stored):
                found = tenant
        return found
