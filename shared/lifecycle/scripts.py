"""The Lua scripts that move a job through its life, each named and declaring every key it touches.

Every key a script reads or writes arrives in KEYS, never built inside the script from a prefix or
taken from ARGV: that is Redis's rule for scripts (and what a Redis Cluster enforces). A script
declares its fixed keys and, for scripts over a batch, the keys it takes per job; ``Script.__call__``
checks what it is given against that declaration. ARGV carries values only.

The workers' calls run with plain EVAL: redis-py's Script objects add a SCRIPT EXISTS round trip to
every pipeline that uses them. The API's (``call_async``) send EVALSHA, and EVAL once when the server
lacks the script: the body is not sent, nor hashed by Redis, on every submit.
"""

from __future__ import annotations

from shared.lifecycle import bulk_scripts
from shared.lifecycle.lua import ANNOUNCE as _ANNOUNCE
from shared.lifecycle.lua import CALL_MANY as _CALL_MANY
from shared.lifecycle.lua import Script

# Several queues: move the first waiting job into its intermediate list, trying the queues in the
# order given; {1-based queue position, job id} or false. LMOVE needs Redis >= 6.2.
CLAIM_FIRST = Script(
    "claim-first",
    (),
    per_item=("queue", "intermediate"),
    source="""
for i = 1, #KEYS, 2 do
  local id = redis.call('LMOVE', KEYS[i], KEYS[i + 1], 'LEFT', 'RIGHT')
  if id then return {(i + 1) / 2, id} end
end
return false
""",
)

# Up to ARGV[1] more job IDs into the intermediate list, where RQ's maintenance finds them if the
# worker dies before the batch starts; it stops before an id starting with ARGV[2] (a bulk chunk,
# a batch of its own). LMOVE needs Redis >= 6.2.
POP = Script(
    "pop",
    ("queue", "intermediate"),
    source="""
local want, stop = tonumber(ARGV[1]), ARGV[2]
local out = {}
while #out < want do
  local id = redis.call('LINDEX', KEYS[1], 0)
  if not id or (stop ~= '' and string.sub(id, 1, #stop) == stop) then break end
  redis.call('LMOVE', KEYS[1], KEYS[2], 'LEFT', 'RIGHT')
  out[#out + 1] = id
end
return out
""",
)

# The API's submit: an Idempotency-Key already used returns its job, a full queue refuses, else the
# input, inferq's info hash and RQ's job hash are written and the job is queued. Nothing half-written.
# ARGV: job id, max length, idempotency value, its ttl, payload, payload ttl, info ttl, job ttl,
# number of info fields, the info pairs, then the job hash pairs.
ENQUEUE = Script(
    "enqueue",
    ("queue", "queues", "job", "payload", "info"),
    per_item=("idempotency",),
    source="""
local idem = KEYS[6]
if idem then
  local existing = redis.call('GET', idem)
  if existing then return {'dup', existing} end
end
if redis.call('LLEN', KEYS[1]) >= tonumber(ARGV[2]) then return {'full', ''} end
if idem then redis.call('SET', idem, ARGV[3], 'EX', ARGV[4]) end
redis.call('SET', KEYS[4], ARGV[5], 'EX', ARGV[6])
local n = tonumber(ARGV[9])
redis.call('HSET', KEYS[5], unpack(ARGV, 10, 9 + 2 * n))
redis.call('EXPIRE', KEYS[5], ARGV[7])
redis.call('SADD', KEYS[2], KEYS[1])
redis.call('HSET', KEYS[3], unpack(ARGV, 10 + 2 * n, #ARGV))
redis.call('EXPIRE', KEYS[3], ARGV[8])
redis.call('RPUSH', KEYS[1], ARGV[1])
return {'ok', ''}
""",
)

# Mark a batch started. Per job: out of the intermediate list; a job whose hash is gone is never
# re-created (announced `expired` if its queue deadline passed unrun); one no longer queued or
# flagged canceled is dropped; the rest get an execution, enter the started registry and are marked
# started, with their hash, input and info outliving the job timeout. Returns per job {id, state}
# and, for started ones, the hash fields, the input and the info hash. Expired jobs are counted.
# ARGV: score, execution ttl, job ttl, worker, stamp, timestamp, channel, model, now, an expired chunk's
# line tail (``lua.line_tail``), metrics group, delivery template, then per job its id and a new execution id.
START = Script(
    "start",
    # waiting: the queue's count of waiting bulk items (keys.waiting_items_key).
    ("intermediate", "started", "hook_queue", "queues", "metrics", "window", "failures", "waiting"),
    # record, results: a bulk chunk's batch (for a single job, its info key again, untouched).
    per_item=(
        "job",
        "info",
        "payload",
        "execution",
        "executions",
        "attempts",
        "delivery",
        "record",
        "results",
        "batch_delivery",
    ),
    source=_ANNOUNCE
    + _CALL_MANY
    + """
local score, ttl, job_ttl = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local worker, stamp, ts, channel, model, now_s = ARGV[4], ARGV[5], ARGV[6], ARGV[7], ARGV[8], tonumber(ARGV[9])
local expired_tail = ARGV[10]
local m, after_metrics = read_metrics(11)
local tpl, at = read_template(after_metrics)
local acc = {}
local out, started, registry = {}, {}, {}
local n = 0
for k = FIXED + 1, #KEYS, STRIDE do
  local job, info, payload, exec, execs, attempts, delivery, record, results, batch_delivery =
    unpack(KEYS, k, k + STRIDE - 1)
  local hook = {delivery = batch_delivery, tpl = tpl, hook_queue = KEYS[3], queues_set = KEYS[4]}
  local id, exec_id = ARGV[at + 2 * n], ARGV[at + 2 * n + 1]
  n = n + 1
  redis.call('LREM', KEYS[1], 1, id)
  -- One read of each hash: origin, status and the fields the worker needs; the info flags.
  local j = redis.call('HMGET', job, 'origin', 'status', 'enqueued_at', 'timeout', 'result_ttl', 'failure_ttl')
  local flags = redis.call('HMGET', info, 'items', 'canceled', 'deadline', 'batch_size')
  local items = tonumber(flags[1]) or 0
  if not j[1] then
    local state = 'vanished'
    if items > 0 and redis.call('HSETNX', info, 'announced', '1') == 1 then
      local lines = chunk_lines(info, expired_tail)
      local moved = {[chunk_from(info)] = -items, failed = items}
      batch_progress(record, results, lines, moved, KEYS[8], stamp, channel, hook)
      redis.call('DEL', payload)
      state = 'expired'
      metrics_add(acc, {['ended:expired'] = items, ['failed:Expired'] = items})
      note_reason(KEYS[7], m, 'Expired', 'expired: still queued when the batch window ended')
    end
    -- Read before the chunk's lines were written: that wrote only `announced`.
    local deadline = tonumber(flags[3] or '')
    if deadline and deadline <= now_s and not flags[4] and not flags[2] then
      local d = {info = info, attempts = attempts, delivery = delivery,
                 job_id = id, model = model, status = 'expired', ttl = redis.call('TTL', info), stamp = stamp,
                 channel = channel, tpl = tpl, hook_queue = KEYS[3], queues_set = KEYS[4]}
      if d.ttl < 1 then d.ttl = tpl.ttl end
      if announce(d) then
        state = 'expired'
        metrics_add(acc, {['ended:expired'] = 1, ['failed:Expired'] = 1})
        note_reason(KEYS[7], m, 'Expired', 'expired: still queued when its deadline passed; it never ran')
      end
    end
    out[n] = {id, state}
  elseif j[2] ~= 'queued' or flags[2] then
    out[n] = {id, 'dropped'}
  else
    redis.call('HSET', exec, 'id', exec_id, 'created_at', ts, 'last_heartbeat', ts, 'worker_name', worker)
    redis.call('EXPIRE', exec, ttl)
    redis.call('ZADD', execs, score + 60, exec_id)
    redis.call('EXPIRE', execs, ttl + 60)
    registry[#registry + 1] = score
    registry[#registry + 1] = id .. ':' .. exec_id
    redis.call('HSET', job, 'last_heartbeat', stamp, 'status', 'started', 'started_at', stamp, 'worker_name', worker)
    redis.call('EXPIRE', job, job_ttl)
    redis.call('EXPIRE', payload, job_ttl)
    redis.call('EXPIRE', info, job_ttl)
    if items > 0 and redis.call('HSETNX', info, 'counted', '1') == 1 then
      waiting_add(KEYS[8], -items)
      if redis.call('EXISTS', record) == 1 then  -- one that expired is not re-created without a TTL
        redis.call('HINCRBY', record, 'queued', -items)
        redis.call('HINCRBY', record, 'running', items)
        redis.call('HSETNX', record, 'started_at', stamp)
      end
    end
    out[n] = {id, 'started', {'started', j[3], j[4], j[5], j[6]}, redis.call('GET', payload) or false,
              redis.call('HGETALL', info)}
    started[#started + 1] = id
  end
end
call_many('ZADD', KEYS[2], registry)  -- RQ's started registry: one call for the batch
for _, id in ipairs(started) do
  redis.call('PUBLISH', channel, cjson.encode({id = id, model = model, status = 'started', batch_size = #started}))
end
metrics_flush(acc, m, KEYS[5], KEYS[6])
return out
""",
)

# End a batch. Per job (ARGV: a JSON entry): a job whose hash is gone is not re-created; one a
# client canceled, RQ's maintenance failed or requeued, or another worker took over meanwhile keeps
# that state (its result is dropped); the rest get their status, RQ result, registry entry and info,
# then their event and webhook. The execution always leaves; the input too unless the job will run
# again. Each job that ends here adds its metrics (entry field `m`, JSON in a string; failures `f`), the
# batch its own: the sum of all of them comes ready-made, and is recounted only if some job did not end.
# Returns {vanished ids, superseded ids}.
# ARGV: now, channel, worker, working seconds, metrics group, the batch's own metrics (JSON), those plus
# every job's (JSON), delivery template, then one JSON entry per job.
FINISH = Script(
    "finish",
    ("started", "finished", "failed", "hook_queue", "queues", "worker", "metrics", "window", "failures"),
    per_item=(
        "job",
        "info",
        "result",
        "payload",
        "execution",
        "executions",
        "attempts",
        "delivery",
        "record",
        "results",
        "batch_delivery",
    ),
    source=_ANNOUNCE
    + _CALL_MANY
    + """
local now_s, channel, worker, working = tonumber(ARGV[1]), ARGV[2], ARGV[3], ARGV[4]
local m, after_metrics = read_metrics(5)
local ended_metrics = {}
local tpl, at = read_template(after_metrics + 2)
local function flat(t)
  local out = {}
  for k, v in pairs(t) do out[#out + 1] = k; out[#out + 1] = v end
  return out
end
local vanished, superseded = {}, {}
local done, failed, running, gone = {}, {}, {}, {}
local counts = {finished = 0, failed = 0}
local n = 0
for k = FIXED + 1, #KEYS, STRIDE do
  local job, info, result, payload, exec, execs, attempts, delivery, record, results, batch_delivery =
    unpack(KEYS, k, k + STRIDE - 1)
  local j = cjson.decode(ARGV[at + n])
  n = n + 1
  local keep_input = false
  local h = redis.call('HMGET', job, 'origin', 'status', 'worker_name')
  if not h[1] then
    vanished[#vanished + 1] = j.id
  else
    local status = h[2]
    local mine = status == 'started' and h[3] == worker
    local f = mine and redis.call('HMGET', info, 'canceled', 'announced', 'webhook')  -- one read for announce
    if not mine or f[1] then
      superseded[#superseded + 1] = j.id
      keep_input = status == 'queued' or (status == 'started' and not mine)
    else
      redis.call('HSET', job, 'status', j.status, 'ended_at', j.ended_at)
      redis.call('EXPIRE', job, j.ttl)
      redis.call('XADD', result, 'MAXLEN', 10, '*', unpack(flat(j.result)))
      redis.call('EXPIRE', result, j.ttl)
      local ended = j.status == 'finished' and done or failed
      ended[#ended + 1] = now_s + j.ttl
      ended[#ended + 1] = j.id
      if not f[2] then j.info.announced = '1' end
      redis.call('HSET', info, unpack(flat(j.info)))
      redis.call('EXPIRE', info, j.ttl)
      counts[j.status] = counts[j.status] + 1
      if j.m then ended_metrics[#ended_metrics + 1] = j.m end
      if j.f then
        for _, record in ipairs(j.f) do note_failure(KEYS[9], m, record) end
      end
      if j.lines then
        local hook = {delivery = batch_delivery, tpl = tpl, hook_queue = KEYS[4], queues_set = KEYS[5]}
        batch_progress(record, results, j.lines, j.moved, false, j.ended_at, channel, hook)
      end
      announce({info = info, attempts = attempts, delivery = delivery,
                job_id = j.id, model = j.model, status = j.status, ttl = j.ttl, stamp = j.ended_at,
                channel = channel, tpl = tpl, hook_queue = KEYS[4], queues_set = KEYS[5], view = j.view,
                read = {f[2], f[3]}})
    end
  end
  running[#running + 1] = j.id .. ':' .. j.exec_id
  gone[#gone + 1] = exec
  redis.call('ZREM', execs, j.exec_id)
  if not keep_input then gone[#gone + 1] = payload end
end
-- The batch's registry moves and deletions, one call each.
call_many('ZADD', KEYS[2], done)
call_many('ZADD', KEYS[3], failed)
call_many('ZREM', KEYS[1], running)
call_many('DEL', false, gone)
-- Every job ended here (the common case): the batch's own metrics and every job's come summed. Otherwise
-- the batch's own, plus those of the jobs that did end.
local acc
if #vanished + #superseded == 0 then
  acc = cjson.decode(ARGV[after_metrics + 1])
else
  acc = cjson.decode(ARGV[after_metrics])
  for _, incs in ipairs(ended_metrics) do metrics_add(acc, cjson.decode(incs)) end
end
if counts.finished > 0 then redis.call('HINCRBY', KEYS[6], 'successful_job_count', counts.finished) end
if counts.failed > 0 then redis.call('HINCRBY', KEYS[6], 'failed_job_count', counts.failed) end
redis.call('HINCRBYFLOAT', KEYS[6], 'total_working_time', working)
metrics_flush(acc, m, KEYS[7], KEYS[8])
return {vanished, superseded}
""",
)

# A client's cancel of a queued or started job. Returns {'ok'}, {'missing'}, {'moved'} (its origin
# is not the queue the caller read: read again) or {'conflict', status}.
# ARGV: job id, owner ('' for any), origin, ttl, now, stamp, channel, metrics group, delivery template.
CANCEL = Script(
    "cancel",
    (
        "job",
        "info",
        "payload",
        "queue",
        "started",
        "canceled",
        "executions",
        "attempts",
        "delivery",
        "hook_queue",
        "queues",
        "metrics",
        "window",
    ),
    source=_ANNOUNCE
    + """
local job, info = KEYS[1], KEYS[2]
local id, owner, origin, ttl, now_s, stamp, channel = ARGV[1], ARGV[2], ARGV[3], tonumber(ARGV[4]),
  tonumber(ARGV[5]), ARGV[6], ARGV[7]
local m, after_metrics = read_metrics(8)
local tpl = read_template(after_metrics)
if redis.call('HEXISTS', job, 'status') == 0 or redis.call('HEXISTS', job, 'origin') == 0 then return {'missing'} end
if owner ~= '' and redis.call('HGET', info, 'owner') ~= owner then return {'missing'} end
if redis.call('HGET', job, 'origin') ~= origin then return {'moved'} end
local status = redis.call('HGET', job, 'status')
if status == 'finished' or status == 'failed' or status == 'stopped' or status == 'canceled' then
  return {'conflict', status}
end
redis.call('HSET', job, 'status', 'canceled', 'ended_at', stamp)
redis.call('LREM', KEYS[4], 0, id)
for _, exec_id in ipairs(redis.call('ZRANGE', KEYS[7], 0, -1)) do
  redis.call('ZREM', KEYS[5], id .. ':' .. exec_id)
end
redis.call('HSET', info, 'canceled', '1')
redis.call('ZADD', KEYS[6], now_s + ttl, id)
redis.call('ZREMRANGEBYSCORE', KEYS[6], '-inf', now_s)
redis.call('EXPIRE', KEYS[6], ttl)
redis.call('EXPIRE', job, ttl)
redis.call('EXPIRE', info, ttl)
redis.call('DEL', KEYS[3])
announce({info = info, attempts = KEYS[8], delivery = KEYS[9], job_id = id,
          model = redis.call('HGET', info, 'model') or '', status = 'canceled', ttl = ttl, stamp = stamp,
          channel = channel, tpl = tpl, hook_queue = KEYS[10], queues_set = KEYS[11]})
metrics_flush({['ended:canceled'] = 1}, m, KEYS[12], KEYS[13])
return {'ok'}
""",
)

# Jobs RQ's own maintenance failed (their worker died, no retries left): their event and webhook,
# once, and counted. ARGV: failure ttl, stamp, channel, a chunk's line tail (``lua.line_tail``), metrics
# group, delivery template, then per job its id. Returns the ids told.
ANNOUNCE_FAILED = Script(
    "announce-failed",
    ("hook_queue", "queues"),
    per_item=(
        "job",
        "info",
        "attempts",
        "delivery",
        "payload",
        "record",
        "results",
        "batch_delivery",
        "metrics",
        "window",
        "failures",
        "waiting",
    ),
    source=_ANNOUNCE
    + """
local ttl, stamp, channel, died_tail = tonumber(ARGV[1]), ARGV[2], ARGV[3], ARGV[4]
local m, after_metrics = read_metrics(5)
local tpl, at = read_template(after_metrics)
local told, n = {}, 0
for k = FIXED + 1, #KEYS, STRIDE do
  local job, info, attempts, delivery, payload, record, results, batch_delivery, totals, window, failures, waiting =
    unpack(KEYS, k, k + STRIDE - 1)
  local hook = {delivery = batch_delivery, tpl = tpl, hook_queue = KEYS[1], queues_set = KEYS[2]}
  local id = ARGV[at + n]
  n = n + 1
  local items = tonumber(redis.call('HGET', info, 'items')) or 0
  if items > 0 and redis.call('HGET', job, 'status') == 'failed' and redis.call('HEXISTS', info, 'announced') == 0 then
    local lines = chunk_lines(info, died_tail)
    batch_progress(record, results, lines, {[chunk_from(info)] = -items, failed = items}, waiting, stamp, channel,
                   hook)
    redis.call('DEL', payload)
  end
  if redis.call('HGET', job, 'status') == 'failed' then
    if announce({info = info, attempts = attempts, delivery = delivery,
                 job_id = id, model = redis.call('HGET', info, 'model') or '', status = 'failed', ttl = ttl,
                 stamp = stamp, channel = channel, tpl = tpl, hook_queue = KEYS[1], queues_set = KEYS[2]}) then
      redis.call('EXPIRE', info, ttl)
      told[#told + 1] = id
      local weight = math.max(items, 1)
      metrics_flush({['ended:failed'] = weight, ['failed:WorkerDied'] = weight}, m, totals, window)
      note_reason(failures, m, 'WorkerDied',
                  'the worker running this job died (killed or crashed) and no retries were left')
    end
  end
end
return told
""",
)

# Started jobs that will not finish here (a forced stop) back at the front of their queue, as they
# were; one no longer started by this worker (canceled, taken over, gone) is left as it is.
# ARGV: worker, then per job its id and execution id.
GIVE_BACK = Script(
    "give-back",
    ("queue", "started"),
    per_item=("job", "execution", "executions"),
    source="""
local worker = ARGV[1]
local back, n = {}, 0
for k = FIXED + 1, #KEYS, STRIDE do
  local job, exec, execs = unpack(KEYS, k, k + STRIDE - 1)
  local id, exec_id = ARGV[2 + 2 * n], ARGV[3 + 2 * n]
  n = n + 1
  redis.call('ZREM', KEYS[2], id .. ':' .. exec_id)
  redis.call('DEL', exec)
  redis.call('ZREM', execs, exec_id)
  if redis.call('HGET', job, 'status') == 'started' and redis.call('HGET', job, 'worker_name') == worker then
    redis.call('HSET', job, 'status', 'queued')
    back[#back + 1] = id
  end
end
for i = #back, 1, -1 do redis.call('LPUSH', KEYS[1], back[i]) end
return back
""",
)

# Popped jobs that never started back at the front of their queue, in order; one no longer in the
# intermediate list (RQ's cleanup took it) is left alone. ARGV: the ids.
GIVE_BACK_HELD = Script(
    "give-back-held",
    ("queue", "intermediate"),
    source="""
local back = {}
for i = 1, #ARGV do
  if redis.call('LREM', KEYS[2], 1, ARGV[i]) > 0 then back[#back + 1] = ARGV[i] end
end
for i = #back, 1, -1 do redis.call('LPUSH', KEYS[1], back[i]) end
return back
""",
)

# A job popped but never started for over a minute (its worker died between pop and start, or lost the
# claim's reply) back at the front of its queue, where RQ's cleanup would retry or fail it. It never ran, so no
# retry is spent; ARGV[2] bounds the rescues (a payload that kills its worker while it is prepared
# ahead must not loop). 1 if rescued. ARGV: id, limit.
RESCUE = Script(
    "rescue",
    ("intermediate", "queue", "job", "info", "first_seen"),
    source="""
if redis.call('HGET', KEYS[3], 'status') ~= 'queued' or redis.call('EXISTS', KEYS[4]) == 0 then return 0 end
if (tonumber(redis.call('HGET', KEYS[4], 'rescued')) or 0) >= tonumber(ARGV[2]) then return 0 end
if redis.call('LREM', KEYS[1], 1, ARGV[1]) == 0 then return 0 end
redis.call('HINCRBY', KEYS[4], 'rescued', 1)
redis.call('DEL', KEYS[5])
redis.call('LPUSH', KEYS[2], ARGV[1])
return 1
""",
)

ALL = (
    CLAIM_FIRST,
    POP,
    ENQUEUE,
    START,
    FINISH,
    CANCEL,
    ANNOUNCE_FAILED,
    GIVE_BACK,
    GIVE_BACK_HELD,
    RESCUE,
    *bulk_scripts.ALL,
)
