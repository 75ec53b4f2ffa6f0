"""Past one Redis: models placed on separate Redis deployments, and every job ID leading back to its own.

Redis Cluster cannot run RQ's worker loop: RQ's transactions and inferq's scripts touch a job's hash, its queue,
its registries and its worker together, keys that hash to different slots. So inferq scales past one Redis the
other way: ``INFERQ_REDIS_SHARDS`` names more Redis deployments (``name=url`` pairs, comma-separated; each URL
may be a Sentinel group's), and a model's ``config.json`` says which one carries it (``"redis": "name"``; absent:
``INFERQ_REDIS_URL``, the shard named ``default``). Each deployment is a complete, truthful RQ layout of its own
models (``rq info -u <its url>``).

A job's ID names its shard with no lookup: a job on the default shard has a bare 24-character ID (as before
shards), one elsewhere is ``<shard>-<24 characters>``. A bulk batch's ID is made the same way.
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Iterable

from inferq.shared import keys
from inferq.shared.errors import ConfigError

DEFAULT = "default"
NAME_RE = re.compile(r"^[a-z][a-z0-9]{0,15}$")
# secrets.token_urlsafe(18): 24 characters of [A-Za-z0-9_-].
TOKEN_CHARS = 24
# A pair starts where a comma is followed by "name=": a Sentinel URL's own commas separate host:port pairs.
# The prefixes of the RQ job IDs inferq makes for itself, and what such an ID is: no client ID begins so.
RESERVED = {keys.CHUNK_PREFIX: "bulk chunks", keys.DELIVERY_PREFIX: "webhook deliveries"}
_PAIR_START = re.compile(r",\s*(?=[a-z][a-z0-9]{0,15}\s*=)")


def parse(text: str) -> dict[str, str]:
    """``INFERQ_REDIS_SHARDS``: ``name=url[,name=url...]`` as {name: url}; ConfigError naming what is wrong."""
    shards: dict[str, str] = {}
    for pair in filter(None, (p.strip() for p in _PAIR_START.split(text.strip()))):
        name, sep, url = (part.strip() for part in pair.partition("="))
        if not sep or not url:
            raise ConfigError(f"INFERQ_REDIS_SHARDS: {pair!r} is not name=url")
        if not NAME_RE.match(name) or name == DEFAULT:
            raise ConfigError(
                f"INFERQ_REDIS_SHARDS: {name!r} is not a shard name (a lowercase letter, then up to 15 lowercase"
                f" letters or digits; {DEFAULT!r} is INFERQ_REDIS_URL's)"
            )
        if f"{name}-" in RESERVED:
            # Every ID of such a shard would begin like a chunk's or a delivery's, which new_id never hands out.
            raise ConfigError(
                f"INFERQ_REDIS_SHARDS: {name!r} cannot name a shard: its job IDs would read as {RESERVED[name + '-']}"
            )
        if name in shards:
            raise ConfigError(f"INFERQ_REDIS_SHARDS names {name!r} twice")
        shards[name] = url
    return shards


def new_id(shard: str) -> str:
    """An unguessable job or batch ID that leads back to ``shard``; never one a chunk or a delivery could have."""
    while True:
        token = secrets.token_urlsafe(18)
        job_id = token if shard == DEFAULT else f"{shard}-{token}"
        if keys.is_client_job(job_id):
            return job_id


def of_id(job_id: str, known: Iterable[str]) -> str:
    """The shard a job or batch ID leads to: ``<shard>-<token>`` for a known shard, else the default one."""
    if len(job_id) > TOKEN_CHARS + 1 and job_id[-TOKEN_CHARS - 1] == "-":
        name = job_id[: -TOKEN_CHARS - 1]
        if name in known and name != DEFAULT:
            return name
    return DEFAULT


def of_models(placed: dict[str, str | None], names: Iterable[str]) -> str:
    """The one shard that carries every model of ``names`` ({model: its config's "redis"}); a worker has one Redis
    connection, so models on different deployments need a worker each (ConfigError)."""
    found = {name: placed[name] or DEFAULT for name in names}
    if len(set(found.values())) > 1:
        shown = ", ".join(f"{name} (Redis {shard!r})" for name, shard in sorted(found.items()))
        raise ConfigError(f"these models are on different Redis deployments: {shown}; run a worker for each")
    return next(iter(found.values()), DEFAULT)
