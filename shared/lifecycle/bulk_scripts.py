"""The Lua scripts of a bulk batch's upload and cancel (``upload``, ``bulk``), each named and declaring its keys.

Each does a bounded amount of work: one slice of an upload's lines or chunks, or one slice of a cancel's chunks
(the slice sizes are constants in ``upload`` and ``bulk``), so no request holds Redis for a whole upload, and
no cancel reads the queue once per chunk. How the steps of an upload fit together: ``upload``'s docstring.
"""

from __future__ import annotations

from shared.lifecycle.lua import ANNOUNCE as _ANNOUNCE
from shared.lifecycle.lua import Script

# A slice of an upload's custom ids: each one's first line, kept in a hash while the upload runs (an upload is
# read a slice at a time, so repeats are found here, not in the API's memory). KEYS: the ids hash.
# ARGV: its ttl, then per id: the id and its line. Returns per id 0 (first seen) or the line that held it first.
CHECK_IDS = Script(
    "check-ids",
    ("ids",),
    source="""
local out = {}
for i = 2, #ARGV, 2 do
  if redis.call('HSETNX', KEYS[1], ARGV[i], ARGV[i + 1]) == 1 then
    out[#out + 1] = 0
  else
    out[#out + 1] = tonumber(redis.call('HGET', KEYS[1], ARGV[i])) or 0
  end
end
redis.call('EXPIRE', KEYS[1], ARGV[1])
return out
""",
)

# A slice of an upload, staged: each chunk's info hash and RQ job hash, the chunk ids in the batch's chunks
# list, and the result lines of refused input lines (the chunks' inputs are plain SETs beside it: a script
# copies every argument into Lua, about 1 ms for 700 kB). Nothing is queued and no record names them yet:
# every key expires with ARGV[1] unless the upload goes on to be queued.
# KEYS: chunks list, results list; per chunk: job, info.
# ARGV: ttl, refused line count, the refused lines, then per chunk: id, info field count, info pairs, job field
# count, job pairs.
STAGE_CHUNKS = Script(
    "stage-chunks",
    ("chunks", "results"),
    per_item=("job", "info"),
    source="""
local ttl = ARGV[1]
local refused = tonumber(ARGV[2])
for i = 3, 2 + refused do redis.call('RPUSH', KEYS[2], ARGV[i]) end
if refused > 0 then redis.call('EXPIRE', KEYS[2], ttl) end
local at = 3 + refused
local function pairs_at(i)
  local n = tonumber(ARGV[i])
  return {unpack(ARGV, i + 1, i + 2 * n)}, i + 1 + 2 * n
end
local ids = {}
for k = FIXED + 1, #KEYS, STRIDE do
  local job, info = KEYS[k], KEYS[k + 1]
  ids[#ids + 1] = ARGV[at]
  local fields
  fields, at = pairs_at(at + 1)
  redis.call('HSET', info, unpack(fields))
  redis.call('EXPIRE', info, ttl)
  fields, at = pairs_at(at)
  redis.call('HSET', job, unpack(fields))
  redis.call('EXPIRE', job, ttl)
end
if #ids > 0 then
  redis.call('RPUSH', KEYS[1], unpack(ids))
  redis.call('EXPIRE', KEYS[1], ttl)
end
return #ids
""",
)

# A staged upload becomes a batch, hidden (`pending`) until its chunks are queued: unless an Idempotency-Key
# already names a batch ('dup', with its value), the staged chunks expired ('stale': the upload took longer than
# their TTL), or the lane has no room for it ('full'), the key is taken for a while, the record written and the
# staged lists kept as long as it. Reads and checks come before the first write.
# KEYS: queue, queues set, record, chunks list, results list, ids hash, idempotency key (the record again when
# there is none, untouched), the queue's waiting items, the first chunk's job.
# ARGV: has idempotency ("1"/"0"), its value, its ttl while pending, record ttl, the most chunks the queue may
# hold ('' for no such bound), the most items it may have waiting ('' for none), chunks, items, record field
# count, record pairs.
QUEUE_BATCH = Script(
    "queue-batch",
    ("queue", "queues", "record", "chunks", "results", "ids", "idempotency", "waiting", "first_job"),
    source="""
if ARGV[1] == '1' then
  local existing = redis.call('GET', KEYS[7])
  if existing then return {'dup', existing} end
end
if redis.call('EXISTS', KEYS[9]) == 0 then return {'stale', ''} end
local chunks, items = tonumber(ARGV[7]), tonumber(ARGV[8])
if ARGV[5] ~= '' and redis.call('LLEN', KEYS[1]) + chunks > tonumber(ARGV[5]) then return {'full', ''} end
if ARGV[6] ~= '' and (tonumber(redis.call('GET', KEYS[8])) or 0) + items > tonumber(ARGV[6]) then
  return {'full', ''}
end
if ARGV[1] == '1' then redis.call('SET', KEYS[7], ARGV[2], 'EX', ARGV[3]) end
local n = tonumber(ARGV[9])
redis.call('HSET', KEYS[3], unpack(ARGV, 10, 9 + 2 * n))
redis.call('EXPIRE', KEYS[3], ARGV[4])
redis.call('EXPIRE', KEYS[4], ARGV[4])
if redis.call('EXISTS', KEYS[5]) == 1 then redis.call('EXPIRE', KEYS[5], ARGV[4]) end
redis.call('UNLINK', KEYS[6])
redis.call('SADD', KEYS[2], KEYS[1])
return {'ok', ''}
""",
)

# A slice of a batch's staged chunks into its queue, in order, each with the TTLs of a queued job from now;
# the queue's count of waiting items grows by theirs (its TTL at least ARGV[4]). Workers may start them at once.
# KEYS: queue, waiting items; per chunk: job, payload, info. ARGV: job ttl, payload ttl, info ttl, waiting
# ttl, the slice's items, then the chunk ids.
PUSH_CHUNKS = Script(
    "push-chunks",
    ("queue", "waiting"),
    per_item=("job", "payload", "info"),
    source="""
local ids, n = {}, 0
for k = FIXED + 1, #KEYS, STRIDE do
  redis.call('EXPIRE', KEYS[k], ARGV[1])
  redis.call('EXPIRE', KEYS[k + 1], ARGV[2])
  redis.call('EXPIRE', KEYS[k + 2], ARGV[3])
  n = n + 1
  ids[n] = ARGV[5 + n]
end
if n > 0 then redis.call('RPUSH', KEYS[1], unpack(ids)) end
redis.call('INCRBY', KEYS[2], ARGV[5])
if redis.call('TTL', KEYS[2]) < tonumber(ARGV[4]) then redis.call('EXPIRE', KEYS[2], ARGV[4]) end
return n
""",
)

# Every chunk is queued: the batch becomes visible, its Idempotency-Key names it for the key's whole TTL, and
# a batch whose items all ended meanwhile ends here (its event and webhook, once). 'ok' or 'missing'.
# KEYS: record, results, idempotency key (the record again when none, untouched), the batch's webhook
# delivery, the webhook queue, the queues set. ARGV: has idempotency, its value, its ttl, stamp, channel,
# delivery template.
PUBLISH_BATCH = Script(
    "publish-batch",
    ("record", "results", "idempotency", "delivery", "hook_queue", "queues"),
    source=_ANNOUNCE
    + """
local tpl = read_template(6)
if redis.call('EXISTS', KEYS[1]) == 0 then return 'missing' end
if ARGV[1] == '1' then
  local held = redis.call('GET', KEYS[3])
  if held == ARGV[2] then
    redis.call('EXPIRE', KEYS[3], ARGV[3])
  elseif not held then
    redis.call('SET', KEYS[3], ARGV[2], 'EX', ARGV[3])
  end
end
redis.call('HDEL', KEYS[1], 'pending')
local hook = {delivery = KEYS[4], tpl = tpl, hook_queue = KEYS[5], queues_set = KEYS[6]}
batch_end_if_done(KEYS[1], KEYS[2], ARGV[4], ARGV[5], hook)
return 'ok'
""",
)

# A slice of a client's cancel of a bulk batch: each of these chunks still queued is canceled (a line per item);
# chunks running finish. {'ok'}, {'missing'} (unknown, another owner's, or not yet visible) or {'ended'}.
# A canceled chunk leaves the queue list here only while the slice's LREMs read at most ARGV[7] entries in all
# (queue length x chunks); else its id stays until a worker pops it, and the start drops it (no longer queued).
# KEYS: record, results, queue, canceled registry, the batch's webhook delivery, the webhook queue, the queues
# set, the model's metrics and window, the queue's waiting items; per chunk: job, info, payload.
# ARGV: owner ('' for any), canceled ttl, now, stamp, channel, a canceled item's line tail (``lua.line_tail``),
# the scan bound, metrics group, delivery template.
CANCEL_CHUNKS = Script(
    "cancel-chunks",
    ("record", "results", "queue", "canceled", "delivery", "hook_queue", "queues", "metrics", "window", "waiting"),
    per_item=("job", "info", "payload"),
    source=_ANNOUNCE
    + """
local record, results = KEYS[1], KEYS[2]
local owner, ttl, now_s, stamp, channel = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), ARGV[4], ARGV[5]
local canceled_tail, scan_bound = ARGV[6], tonumber(ARGV[7])
local m, after_metrics = read_metrics(8)
local tpl = read_template(after_metrics)
local acc = {}
local hook = {delivery = KEYS[5], tpl = tpl, hook_queue = KEYS[6], queues_set = KEYS[7]}
if redis.call('EXISTS', record) == 0 or redis.call('HEXISTS', record, 'pending') == 1 then return {'missing'} end
if owner ~= '' and redis.call('HGET', record, 'owner') ~= owner then return {'missing'} end
if redis.call('HEXISTS', record, 'ended_at') == 1 then return {'ended'} end
local scan = redis.call('LLEN', KEYS[3]) * (#KEYS - FIXED) / STRIDE <= scan_bound
for k = FIXED + 1, #KEYS, STRIDE do
  local job, info, payload = KEYS[k], KEYS[k + 1], KEYS[k + 2]
  local items = tonumber(redis.call('HGET', info, 'items')) or 0
  if items > 0 and redis.call('HGET', job, 'status') == 'queued' and redis.call('HEXISTS', info, 'canceled') == 0 then
    local id = redis.call('HGET', info, 'id')
    redis.call('HSET', job, 'status', 'canceled', 'ended_at', stamp)
    if scan then redis.call('LREM', KEYS[3], 1, id) end
    redis.call('HSET', info, 'canceled', '1', 'announced', '1')
    redis.call('ZADD', KEYS[4], now_s + ttl, id)
    local lines = chunk_lines(info, canceled_tail)
    local moved = {[chunk_from(info)] = -items, canceled = items}
    batch_progress(record, results, lines, moved, KEYS[10], stamp, channel, hook)
    redis.call('DEL', payload)
    redis.call('EXPIRE', job, ttl)
    redis.call('EXPIRE', info, ttl)
    metrics_add(acc, {['ended:canceled'] = items})
  end
end
metrics_flush(acc, m, KEYS[8], KEYS[9])
redis.call('ZREMRANGEBYSCORE', KEYS[4], '-inf', now_s)
if redis.call('EXISTS', KEYS[4]) == 1 then redis.call('EXPIRE', KEYS[4], ttl) end
return {'ok'}
""",
)

ALL = (CHECK_IDS, STAGE_CHUNKS, QUEUE_BATCH, PUSH_CHUNKS, PUBLISH_BATCH, CANCEL_CHUNKS)
