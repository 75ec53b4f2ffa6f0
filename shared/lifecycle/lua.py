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
from typing import Any

from redis.exceptions import NoScriptError

# Shared by the scripts that end a job: tell the world once (the info hash's `announced` field),
# by a pub/sub event and, when the job has one, a webhook delivery queued as an RQ job.
# A delivery's id is derived from its job's, so it can be queued only once.
ANNOUNCE = """
local function read_template(at)
  local ttl, prefix, n = tonumber(ARGV[at]), ARGV[at + 1], tonumber(ARGV[at + 2])
  local fields = {}
  for i = at + 3, at + 2 + 2 * n do fields[#fields + 1] = ARGV[i] end
  return {ttl = ttl, prefix = prefix, fields = fields}, at + 3 + 2 * n
end
local function queue_delivery(tpl, hook_queue, queues_set, delivery_key, job_id, stamp)
  local delivery_id = tpl.prefix .. job_id
  if redis.call('EXISTS', delivery_key) == 1 then return end
  redis.call('HSET', delivery_key, unpack(tpl.fields))
  redis.call('HSET', delivery_key, 'created_at', stamp, 'enqueued_at', stamp, 'description', 'webhook for ' .. job_id)
  redis.call('EXPIRE', delivery_key, tpl.ttl)
  redis.call('RPUSH', hook_queue, delivery_id)
  redis.call('SADD', queues_set, hook_queue)
end
-- The bulk items waiting in a queue (keys.waiting_items_key), the bulk lane's bound: moved by n. A count whose
-- key expired stays gone (an INCRBY would re-create it without a TTL), and never goes below 0.
local function waiting_add(key, n)
  if not key or n == 0 or redis.call('EXISTS', key) == 0 then return end
  if redis.call('INCRBY', key, n) < 0 then redis.call('SET', key, 0, 'KEEPTTL') end
end
-- A bulk batch ends once every item ended, and not while its upload is still being queued (`pending`: the
-- upload's last step ends it then). hook: where its own webhook delivery goes {delivery, tpl, hook_queue, queues_set}.
local function batch_end_if_done(record, results, stamp, channel, hook)
  local r = redis.call('HMGET', record, 'total', 'finished', 'failed', 'canceled', 'result_ttl', 'ended_at', 'id',
                       'model', 'pending')
  if r[6] or r[9] or not r[1] then return end
  if (tonumber(r[2]) or 0) + (tonumber(r[3]) or 0) + (tonumber(r[4]) or 0) >= (tonumber(r[1]) or 0) then
    redis.call('HSET', record, 'ended_at', stamp)
    redis.call('EXPIRE', record, tonumber(r[5]) or 1)
    redis.call('EXPIRE', results, tonumber(r[5]) or 1)
    emit(channel, cjson.encode({id = r[7], model = r[8], kind = 'batch', status = 'ended'}))
    if redis.call('HEXISTS', record, 'webhook') == 1 then
      queue_delivery(hook.tpl, hook.hook_queue, hook.queues_set, hook.delivery, r[7], stamp)
    end
  end
end
-- A bulk batch's chunk ended some items: their result lines, its counts, and the batch's end once all ended.
-- lines: JSON strings; moved: {field = n} added to the record's counts (queued items also leave `waiting`, the
-- queue's count, or false).
local function batch_progress(record, results, lines, moved, waiting, stamp, channel, hook)
  if moved.queued then waiting_add(waiting, moved.queued) end
  -- A record that expired is not re-created without a TTL by the counts below.
  if redis.call('EXISTS', record) == 0 then return end
  for _, line in ipairs(lines) do redis.call('RPUSH', results, line) end
  -- Results written before the end (which sets their TTL) expire with the record, should it never end.
  if #lines > 0 and redis.call('TTL', results) == -1 then
    local left = redis.call('TTL', record)
    if left > 0 then redis.call('EXPIRE', results, left) end
  end
  for name, n in pairs(moved) do redis.call('HINCRBY', record, name, n) end
  batch_end_if_done(record, results, stamp, channel, hook)
end
-- The items of a chunk that ends without running (canceled, expired, its worker died): one line each. The info
-- hash holds their custom ids as the API encoded them (JSON strings, ASCII only, one a line) and `tail` is the
-- rest of each line, encoded by the caller: nothing a client sent is decoded here (Redis's cjson refuses some
-- escapes Python's json takes), so nothing it sent can fail a script after its first write.
local function chunk_lines(info, tail)
  local ids = redis.call('HGET', info, 'custom_ids')
  local lines = {}
  if not ids then return lines end
  for id in string.gmatch(ids, '[^\\n]+') do lines[#lines + 1] = '{"custom_id":' .. id .. tail end
  return lines
end
-- Where a chunk's items were counted: 'running' once a worker started it, else 'queued'.
local function chunk_from(info)
  if redis.call('HEXISTS', info, 'counted') == 1 then return 'running' end
  return 'queued'
end
-- Metrics (shared/metrics.py): ARGV's group of five, then increments summed over the run and added once
-- per field to a model's totals and its current window (each refreshed with its TTL), and its recent failures.
local function read_metrics(at)
  return {ttl = tonumber(ARGV[at]), window_ttl = tonumber(ARGV[at + 1]), keep = tonumber(ARGV[at + 2]),
          failures_ttl = tonumber(ARGV[at + 3]), now = tonumber(ARGV[at + 4])}, at + 5
end
local function metrics_add(acc, incs)
  for name, v in pairs(incs) do acc[name] = (acc[name] or 0) + v end
end
local function metrics_write(acc, key, ttl)
  local any = false
  for name, v in pairs(acc) do
    redis.call('HINCRBYFLOAT', key, name, v)
    any = true
  end
  if any then redis.call('EXPIRE', key, ttl) end
end
local function metrics_flush(acc, m, totals, window)
  metrics_write(acc, totals, m.ttl)
  metrics_write(acc, window, m.window_ttl)
end
local function note_failure(key, m, record)
  redis.call('LPUSH', key, record)
  redis.call('LTRIM', key, 0, m.keep - 1)
  redis.call('EXPIRE', key, m.failures_ttl)
end
local function note_reason(key, m, reason, text)
  note_failure(key, m, cjson.encode({at = m.now, reason = reason, error = text}))
end
-- d: {info, attempts, delivery, job_id, model, status, ttl, stamp, channel, tpl, hook_queue, queues_set, view}
-- view: the job's view as JSON text (shared.jobs.ended_view), for a request waiting on it; spliced in as
-- it is, since cjson would re-encode its numbers with 14 digits.
-- read: the info hash's `announced` and `webhook` when the caller read them already (and set `announced`).
local function announce(d)
  local read = d.read
  if not read and redis.call('EXISTS', d.info) == 1 then
    if redis.call('HSETNX', d.info, 'announced', '1') == 0 then return false end
    read = {false, redis.call('HEXISTS', d.info, 'webhook') == 1}
  end
  if read then
    if read[1] then return false end
    if read[2] then
      redis.call('EXPIRE', d.attempts, d.ttl)
      queue_delivery(d.tpl, d.hook_queue, d.queues_set, d.delivery, d.job_id, d.stamp)
    end
  end
  local event = cjson.encode({id = d.job_id, model = d.model, status = d.status})
  if d.view then event = string.sub(event, 1, -2) .. ',"view":' .. d.view .. '}' end
  emit(d.channel, event)
  return true
end
"""
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


CALL_MANY = """
-- One call for many arguments (a batch's registry entries, its deleted keys), in slices unpack takes.
local function call_many(cmd, key, args)
  for i = 1, #args, 1000 do
    local last = math.min(i + 999, #args)
    if key then redis.call(cmd, key, unpack(args, i, last)) else redis.call(cmd, unpack(args, i, last)) end
  end
end
"""


@dataclass(frozen=True)
class Script:
    """A named Lua script and the keys it declares: fixed ones, then a group per item."""

    name: str
    keys: tuple[str, ...]
    source: str
    per_item: tuple[str, ...] = ()

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
