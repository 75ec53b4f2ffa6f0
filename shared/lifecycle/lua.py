"""What the lifecycle scripts (``scripts``) are made of: the ``Script`` that names one, declares its keys
and runs it, and the Lua functions several share (ending a job or a bulk batch, one call for many arguments).

The functions are prepended to each script's source: Redis runs every script on its own, with no shared
library (Redis 7's functions would be one, but inferq supports Redis >= 6.2).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

from redis.exceptions import NoScriptError

# The folder of the scripts' sources (one <name>.lua each) and of the functions several share (lib/).
SOURCES = Path(__file__).with_name("lua")


def _parts(path: Path) -> tuple[list[str], str]:
    """A .lua file's header (its leading ``--`` lines, up to the first blank line) and its code after it."""
    text = path.read_text(encoding="utf-8")
    head, _, code = text.partition("\n\n")
    return [line.removeprefix("--").strip() for line in head.splitlines()], "\n" + code


def library(name: str) -> str:
    """The Lua functions of lib/<name>.lua, as prepended to each script that uses them."""
    return _parts(SOURCES / "lib" / f"{name}.lua")[1]


# Shared by the scripts that end a job or a batch (lib/announce.lua): telling of an end once, a webhook
# delivery, bulk progress, metrics. One call for many arguments (lib/call_many.lua).
ANNOUNCE = library("announce")
CALL_MANY = library("call_many")
# Every script made of ANNOUNCE ends jobs or batches, and tells of each end with ``emit``: at once, or, when the
# caller will confirm the writes first (INFERQ_DURABILITY, shared/durability.py), into the OUTBOX the script
# returns beside its own reply, for the caller to publish once a replica (or the disk) has them.
_EMITTING = """local DEFER = table.remove(ARGV) == '1'
local OUTBOX = {}
local function emit(channel, message)
  if DEFER then OUTBOX[#OUTBOX + 1] = message else redis.call('PUBLISH', channel, message) end
end
local function main()
"""


def line_tail(status: str, error: str | None = None) -> str:
    """What follows the custom_id in a line ``chunk_lines`` writes for a chunk that ends unrun: ``,"status":…}``.

    Encoded here, as the custom ids were at upload: the scripts only join text, never decode what a client sent.
    """
    fields = {"status": status} if error is None else {"status": status, "error": error}
    return "," + json.dumps(fields, separators=(",", ":"))[1:]


EXPIRED_LINE_TAIL = line_tail("expired", "expired: still queued when the batch window ended")
DIED_LINE_TAIL = line_tail("failed", "the worker running this item died (killed or crashed) and no retries were left")
CANCELED_LINE_TAIL = line_tail("canceled")


Items = Sequence[Sequence[str]]


_HEADER_FIELDS = ("KEYS", "KEYS per item", "uses")


@dataclass(frozen=True)
class Script:
    """A named Lua script and the keys it declares: fixed ones, then a group per item."""

    name: str
    keys: tuple[str, ...]
    source: str
    per_item: tuple[str, ...] = ()

    @classmethod
    def load(cls, name: str) -> Script:
        """The script in <name>.lua, its keys as its header declares them (``KEYS:``, ``KEYS per item:``),
        after the lib/ functions its header's ``uses:`` names."""
        header, code = _parts(SOURCES / f"{name}.lua")
        fields = dict(line.split(": ", 1) for line in header if line.split(": ", 1)[0] in _HEADER_FIELDS)
        fixed = fields.get("KEYS", "")
        keys = () if fixed == "(none fixed)" else tuple(k.strip() for k in fixed.split(","))
        per_item = tuple(k.strip() for k in fields["KEYS per item"].split(",")) if "KEYS per item" in fields else ()
        uses = [u.strip() for u in fields["uses"].split(",")] if "uses" in fields else []
        return cls(name, keys, "".join(library(u) for u in uses) + code, per_item)

    @property
    def emits(self) -> bool:
        """Whether it tells of ends (it is made of ANNOUNCE): its reply is then [its own reply, deferred events]."""
        return "local function announce(" in self.source

    def __call__(
        self, client: Any, fixed: Sequence[str], items: Items = (), args: Sequence[Any] = (), *, defer: bool = False
    ) -> Any:
        flat = self._keys(fixed, items)
        return client.eval(self.body, len(flat), *flat, *self._args(args, defer))

    async def call_async(self, client: Any, fixed: Sequence[str], items: Items = (), args: Sequence[Any] = ()) -> Any:
        """The same call on a ``redis.asyncio`` client, by the script's hash while the server holds it."""
        flat = self._keys(fixed, items)
        args = self._args(args, False)
        try:
            return await client.evalsha(self.sha, len(flat), *flat, *args)
        except NoScriptError:  # a restarted or flushed server: EVAL caches it again
            return await client.eval(self.body, len(flat), *flat, *args)

    def _args(self, args: Sequence[Any], defer: bool) -> Sequence[Any]:
        """An emitting script's ARGV ends with whether its events wait for the caller (its prelude takes it off)."""
        if not self.emits:
            if defer:
                raise TypeError(f"script {self.name} tells of no end: nothing to defer")
            return args
        return [*args, "1" if defer else "0"]

    def _keys(self, fixed: Sequence[str], items: Items) -> list[str]:
        if len(fixed) != len(self.keys):
            raise TypeError(f"script {self.name} declares keys {self.keys}, got {len(fixed)}")
        flat = list(fixed)
        for group in items:
            if len(group) != len(self.per_item):
                raise TypeError(f"script {self.name} takes {self.per_item} per item, got {len(group)}")
            flat.extend(group)
        return flat

    @cached_property
    def body(self) -> str:
        stride = len(self.per_item)
        head = f"-- inferq:{self.name}\nlocal FIXED, STRIDE = {len(self.keys)}, {stride}\n"
        if not self.emits:
            return head + self.source
        return f"{head}{_EMITTING}{self.source}\nend\nreturn {{main(), OUTBOX}}\n"

    @cached_property
    def sha(self) -> str:
        """What EVALSHA names the script by: the SHA-1 of its body, as Redis computes it."""
        return hashlib.sha1(self.body.encode(), usedforsecurity=False).hexdigest()


def told(reply: Any) -> tuple[Any, list[bytes]]:
    """An emitting script's reply split: (its own reply, the events it deferred for its caller to publish)."""
    own, outbox = reply
    return own, list(outbox)
