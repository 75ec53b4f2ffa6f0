"""What the lifecycle scripts (``scripts``) are made of: the ``Script`` that names one, declares its keys
and runs it, and the Lua functions several share (ending a job or a bulk batch, one call for many arguments).

The functions are prepended to each script's source: Redis runs every script on its own, with no shared
library (Redis 7's functions would be one, but inferq supports Redis >= 6.2).
"""

from __future__ import annotations

import hashlib
import json
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

from redis.client import Pipeline
from redis.exceptions import NoScriptError

from inferq.shared.lifecycle.info import F

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


_HEADER_FIELDS = ("KEYS", "KEYS per item", "ARGV", "uses")

# The groups of arguments several scripts take, named in a header's ARGV line as ``@name``: the metrics group
# (``calls.metrics_args``) and the webhook delivery template (``calls.delivery_args``).
SHAPES = {
    "metrics": "ttl, window_ttl, keep, failures_ttl, now",
    "delivery": "ttl, prefix, fields<>",
}


@dataclass(frozen=True)
class Arg:
    """One named argument of a script's ARGV, as its header declares it: ``name`` a value, ``name[]`` a list of
    values, ``name[a, b]`` a list of records (read by column in Lua, ``A.name.a[i]``: a batch's jobs are not a table
    each), ``name{a, b}`` a record, ``name<>`` a hash's fields (a mapping, handed to Lua as the flat field/value list
    HSET takes), ``@shape`` the group ``SHAPES`` names."""

    name: str
    kind: str  # "value", "list", "pairs", "record" (fields), "records" (a list of records of fields)
    fields: tuple[Arg, ...] = ()

    def encode(self, value: Any, out: list[Any]) -> None:
        """Append ``value``'s ARGV form: a list or hash is its length, then its items."""
        kind = self.kind
        if kind == "value":
            out.append(value)
        elif kind == "list":
            out.append(len(value))
            out.extend(value)
        elif kind == "pairs":
            out.append(len(value))
            for pair in value.items():
                out.extend(pair)
        elif kind == "record":
            _encode_record(self.name, self.fields, value, out)
        else:
            out.append(len(value))
            width, pairs = len(self.fields), self._pairs_at
            for record in value:
                # A batch's jobs as tuples of their fields in order, checked by count: values as they are, and
                # (when the record has any) its hashes' fields flattened, with no call per field.
                if pairs is not None and isinstance(record, tuple) and len(record) == width:
                    if not pairs:
                        out.extend(record)
                        continue
                    for at, item in enumerate(record):
                        if at in pairs:
                            out.append(len(item))
                            for pair in item.items():
                                out.extend(pair)
                        else:
                            out.append(item)
                else:
                    _encode_record(self.name, self.fields, record, out)

    @cached_property
    def _pairs_at(self) -> frozenset[int] | None:
        """For a list of records of values and hashes only: the positions of its hashes (None: other fields)."""
        if any(f.kind not in ("value", "pairs") for f in self.fields):
            return None
        return frozenset(n for n, f in enumerate(self.fields) if f.kind == "pairs")


def _encode_record(name: str, fields: tuple[Arg, ...], value: Any, out: list[Any]) -> None:
    """A record by name (a mapping, exactly its fields) or in its fields' order (a sequence)."""
    if isinstance(value, Mapping):
        if len(value) != len(fields) or any(f.name not in value for f in fields):
            raise TypeError(f"argument {name} takes {[f.name for f in fields]}, got {sorted(value)}")
        for field in fields:
            field.encode(value[field.name], out)
        return
    if len(value) != len(fields):
        raise TypeError(f"argument {name} takes {[f.name for f in fields]}, got {len(value)} values")
    for field, item in zip(fields, value, strict=True):
        field.encode(item, out)


def parse_args(text: str) -> tuple[Arg, ...]:
    """A header's ARGV declaration (``Arg`` says the forms), names separated by commas."""
    args, rest = _parse(text.replace(" ", ""), 0)
    if rest != len(text.replace(" ", "")):
        raise ValueError(f"cannot read the ARGV declaration {text!r}")
    return args


def _parse(text: str, at: int) -> tuple[tuple[Arg, ...], int]:
    out: list[Arg] = []
    while at < len(text) and text[at] not in "]}":
        end = at
        while end < len(text) and (text[end].isalnum() or text[end] in "_@"):
            end += 1
        name = text[at:end]
        if not name:
            raise ValueError(f"cannot read the ARGV declaration {text!r} at {at}")
        at = end
        if name.startswith("@"):
            out.append(Arg(name[1:], "record", parse_args(SHAPES[name[1:]])))
        elif text.startswith("[]", at):
            out.append(Arg(name, "list"))
            at += 2
        elif text.startswith("<>", at):
            out.append(Arg(name, "pairs"))
            at += 2
        elif at < len(text) and text[at] in "[{":
            fields, at = _parse(text, at + 1)
            out.append(Arg(name, "records" if text[at] == "]" else "record", fields))
            at += 1
        else:
            out.append(Arg(name, "value"))
        if at < len(text) and text[at] == ",":
            at += 1
    if len({a.name for a in out}) != len(out):
        raise ValueError(f"the ARGV declaration {text!r} names an argument twice")
    return tuple(out), at


_UNPACK_MAX = 4000  # values one unpack() copies (Lua's C stack holds LUAI_MAXCSTACK, 8000)


def decoder(args: Sequence[Arg]) -> str:
    """Lua that reads ARGV into the table A by the script's declared names (``Arg`` says the forms): straight-line
    code made for the script, constant indices up to its first list, so that a call spends no time interpreting a
    spec (a generic decoder cost Redis about 7 us a call on ENQUEUE's 63 arguments)."""
    lines = ["local A = {}"]
    _decode_into(args, "A", lines, 1, 0)
    return "\n".join(lines) + "\n"


def _decode_into(fields: Sequence[Arg], target: str, lines: list[str], at: int | None, depth: int) -> int | None:
    """Append the code decoding ``fields`` into the table ``target``; ``at`` the next ARGV index when it is known
    here (an int), None once it is the run-time local ``at``. Returns the same after the fields."""
    for field in fields:
        at = _decode_one(field, f"{target}['{field.name}']", lines, at, depth)
    return at


def _decode_one(arg: Arg, dest: str, lines: list[str], at: int | None, depth: int) -> int | None:
    if arg.kind == "value":
        if at is not None:
            lines.append(f"{dest} = ARGV[{at}]")
            return at + 1
        lines.append(f"{dest} = ARGV[at]; at = at + 1")
        return None
    if arg.kind == "record":
        lines.append(f"{dest} = {{}}")
        return _decode_into(arg.fields, dest, lines, at, depth)
    if at is not None:  # from here on the index is known only at run time
        lines.append(f"local at = {at}")
    n, i = f"n{depth}", f"i{depth}"
    if arg.kind in ("list", "pairs"):
        width = 1 if arg.kind == "list" else 2
        # unpack is C's copy, several times a Lua loop's; the loop past what Lua's stack takes in one call.
        lines.append(f"do local {n} = {width} * tonumber(ARGV[at]); local t")
        lines.append(f"if {n} <= {_UNPACK_MAX} then t = {{unpack(ARGV, at + 1, at + {n})}}")
        lines.append(f"else t = {{}}; for {i} = 1, {n} do t[{i}] = ARGV[at + {i}] end end")
        lines.append(f"{dest} = t; at = at + {n} + 1 end")
        return None
    # A list of records, read by column: dest[field][i].
    columns = [f"c{depth}_{k}" for k in range(len(arg.fields))]
    lines.append(f"do local {n} = tonumber(ARGV[at]); at = at + 1")
    lines.append(f"local {', '.join(columns)} = {', '.join('{}' for _ in columns)}")
    named = ", ".join(f"['{f.name}'] = {c}" for f, c in zip(arg.fields, columns, strict=True))
    lines.append(f"{dest} = {{{named}}}")
    lines.append(f"for {i} = 1, {n} do")
    for field, column in zip(arg.fields, columns, strict=True):
        _decode_one(field, f"{column}[{i}]", lines, None, depth + 1)
    lines.append("end end")
    return None


def _named(source: str, kind: str, names: Mapping[str, str]) -> str:
    """``source`` with each ``K.<name>`` / ``F.<NAME>`` written out as what it names (``names``), so that a call
    builds no table of them; a name the script does not declare fails here, when the body is built."""

    def one(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in names:
            raise ValueError(f"{kind}.{name} is not declared")
        return names[name]

    return re.sub(rf"(?<![\w.]){kind}\.([A-Za-z_]\w*)", one, source)


# The info hash's field names as the scripts spell them: F.ITEMS is info.F.ITEMS, written into the body as 'items'.
_INFO_NAMES = {n: f"'{v}'" for n, v in vars(F).items() if n.isupper()}


@dataclass(frozen=True)
class Script:
    """A named Lua script, the keys it declares (fixed ones, then a group per item) and its named arguments.

    In Lua, ``K.<name>`` is a fixed key, ``A.<name>`` an argument (``Arg`` says the forms; values arrive as
    strings) and ``F.<NAME>`` an info hash field's name (``info.F``), so the scripts and the Python that reads
    the hash spell each field once.
    """

    name: str
    keys: tuple[str, ...]
    source: str
    per_item: tuple[str, ...] = ()
    args: tuple[Arg, ...] = ()

    @classmethod
    def load(cls, name: str) -> Script:
        """The script in <name>.lua, its keys and arguments as its header declares them (``KEYS:``,
        ``KEYS per item:``, ``ARGV:``), after the lib/ functions its header's ``uses:`` names."""
        header, code = _parts(SOURCES / f"{name}.lua")
        fields = dict(line.split(": ", 1) for line in header if line.split(": ", 1)[0] in _HEADER_FIELDS)
        fixed = fields.get("KEYS", "")
        keys = () if fixed == "(none fixed)" else tuple(k.strip() for k in fixed.split(","))
        per_item = tuple(k.strip() for k in fields["KEYS per item"].split(",")) if "KEYS per item" in fields else ()
        uses = [u.strip() for u in fields["uses"].split(",")] if "uses" in fields else []
        args = parse_args(fields["ARGV"]) if fields.get("ARGV", "(none)") != "(none)" else ()
        return cls(name, keys, "".join(library(u) for u in uses) + code, per_item, args)

    @property
    def emits(self) -> bool:
        """Whether it tells of ends (it is made of ANNOUNCE): its reply is then [its own reply, deferred events]."""
        return "local function announce(" in self.source

    def __call__(
        self,
        client: Any,
        fixed: Sequence[str],
        items: Items = (),
        args: Mapping[str, Any] | None = None,
        *,
        defer: bool = False,
    ) -> Any:
        """The call by the script's hash (EVALSHA): its 5-13 KB body crosses to Redis, and is parsed there, only when
        the server lacks it (EVAL costs Redis about 20 us a call, EVALSHA about 5). In a pipeline (or a transaction,
        where a NOSCRIPT would fail one command of it) the script is loaded first on the pipeline's connection, once
        per socket (``_loaded_on``)."""
        flat = self._keys(fixed, items)
        argv = self._args(args, defer)
        if isinstance(client, Pipeline):
            _loaded_on(client, self)
            return client.evalsha(self.sha, len(flat), *flat, *argv)
        try:
            return client.evalsha(self.sha, len(flat), *flat, *argv)
        except NoScriptError:  # a restarted or flushed server, or a replica just promoted: EVAL caches it again
            return client.eval(self.body, len(flat), *flat, *argv)

    async def call_async(
        self,
        client: Any,
        fixed: Sequence[str],
        items: Items = (),
        args: Mapping[str, Any] | None = None,
        *,
        defer: bool = False,
    ) -> Any:
        """The same call on a ``redis.asyncio`` client, by the script's hash while the server holds it."""
        flat = self._keys(fixed, items)
        argv = self._args(args, defer)
        try:
            return await client.evalsha(self.sha, len(flat), *flat, *argv)
        except NoScriptError:  # a restarted or flushed server: EVAL caches it again
            return await client.eval(self.body, len(flat), *flat, *argv)

    def queue_async(
        self, pipe: Any, fixed: Sequence[str], items: Items = (), args: Mapping[str, Any] | None = None
    ) -> None:
        """The call by hash queued on a ``redis.asyncio`` pipeline that is not a transaction, after the commands it
        must follow: a server that lacks the script answers that one command NOSCRIPT, for the caller to send it
        again by ``call_async``."""
        flat = self._keys(fixed, items)
        pipe.evalsha(self.sha, len(flat), *flat, *self._args(args, False))

    async def eval_async(
        self, client: Any, fixed: Sequence[str], items: Items = (), args: Mapping[str, Any] | None = None
    ) -> Any:
        """The call with its body (EVAL), which caches it on the server: after a ``queue_async`` answered NOSCRIPT."""
        flat = self._keys(fixed, items)
        return await client.eval(self.body, len(flat), *flat, *self._args(args, False))

    def _args(self, args: Mapping[str, Any] | None, defer: bool) -> list[Any]:
        """The ARGV of ``args`` (exactly the declared names); an emitting script's ends with whether its events wait
        for the caller (its prelude takes it off)."""
        out: list[Any] = []
        _encode_record(self.name, self.args, args or {}, out)
        if not self.emits:
            if defer:
                raise TypeError(f"script {self.name} tells of no end: nothing to defer")
            return out
        out.append("1" if defer else "0")
        return out

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
        """The Lua Redis runs: its fixed keys and info fields written out (``_named``), the ARGV decoder made for it
        (``decoder``), then the lib/ functions and the script; an emitting one's code inside ``main``."""
        head = f"-- inferq:{self.name}\nlocal FIXED, STRIDE = {len(self.keys)}, {len(self.per_item)}\n"
        if self.emits:
            head += _EMITTING
        if self.args:
            head += decoder(self.args)
        keys = {key: f"KEYS[{n}]" for n, key in enumerate(self.keys, 1)}
        source = _named(_named(self.source, "K", keys), "F", _INFO_NAMES)
        if not self.emits:
            return head + source
        return f"{head}local function main()\n{source}\nend\nreturn {{main(), OUTBOX}}\n"

    @cached_property
    def sha(self) -> str:
        """What EVALSHA names the script by: the SHA-1 of its body, as Redis computes it."""
        return hashlib.sha1(self.body.encode(), usedforsecurity=False).hexdigest()


# How long a connection's socket is trusted to hold the scripts it loaded: a SCRIPT FLUSH on a live server (the
# only way to lose them without the socket closing: a restart or failover reconnects) heals within this.
LOADED_TRUST_S = 60.0


def _loaded_on(pipe: Pipeline, script: Script) -> None:
    """Make sure the server behind ``pipe``'s connection holds ``script``: SCRIPT LOAD on that connection, once per
    socket (and again after ``LOADED_TRUST_S``), before the pipeline is sent. The pipeline keeps the connection it
    took until it is sent, so the load and the EVALSHA reach the same server."""
    connection = pipe.connection
    if connection is None:
        connection = pipe.connection = pipe.connection_pool.get_connection()
    connection.connect()  # a no-op when connected: the socket the marks below belong to
    sock = getattr(connection, "_sock", None)
    now = time.monotonic()
    marks: tuple[Any, float, set[str]] | None = getattr(connection, "_inferq_scripts", None)
    if marks is None or marks[0] is not sock or now - marks[1] > LOADED_TRUST_S:
        marks = (sock, now, set())
        connection._inferq_scripts = marks  # type: ignore[attr-defined]
    if script.sha not in marks[2]:
        pipe.immediate_execute_command("SCRIPT LOAD", script.body)
        marks[2].add(script.sha)


def told(reply: Any) -> tuple[Any, list[bytes]]:
    """An emitting script's reply split: (its own reply, the events it deferred for its caller to publish)."""
    own, outbox = reply
    return own, list(outbox)
