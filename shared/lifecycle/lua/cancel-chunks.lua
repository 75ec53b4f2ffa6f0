-- cancel-chunks: A slice of a client's cancel of a bulk batch: each of these chunks still queued is canceled (a line per item);
-- chunks running finish. {'ok'}, {'missing'} (unknown, another owner's, or not yet visible) or {'ended'}.
-- A canceled chunk leaves the queue list here only while the slice's LREMs read at most `scan_bound` entries in all
-- (queue length x chunks); else its id stays until a worker pops it, and the start drops it (no longer queued).
-- One in the queue's fair backlog (lib/fair.lua: fair_tags, fair_backlog) leaves it here whatever its length.
-- owner: '' for any; ttl: a canceled chunk's; canceled_tail: a canceled item's line tail (``lua.line_tail``).
-- record, results: the batch's; canceled: the queue's canceled registry; delivery: the batch's webhook delivery.
-- span: a chunk's attempt's trace span (tracing on), left by an attempt that never ended.
--
-- KEYS: record, results, queue, canceled, delivery, hook_queue, queues, metrics, window, waiting, fair_tags, fair_backlog
-- KEYS per item: job, info, payload, span
-- ARGV: owner, ttl, now, stamp, channel, canceled_tail, scan_bound, @metrics, @delivery
-- uses: announce, fair

local record, results = K.record, K.results
local owner, ttl, now_s, stamp, channel = A.owner, tonumber(A.ttl), tonumber(A.now), A.stamp, A.channel
local acc = {}
local hook = {delivery = K.delivery, tpl = A.delivery, hook_queue = K.hook_queue, queues_set = K.queues}
if redis.call('EXISTS', record) == 0 or redis.call('HEXISTS', record, 'pending') == 1 then return {'missing'} end
if owner ~= '' and redis.call('HGET', record, 'owner') ~= owner then return {'missing'} end
if redis.call('HEXISTS', record, 'ended_at') == 1 then return {'ended'} end
local scan = redis.call('LLEN', K.queue) * (#KEYS - FIXED) / STRIDE <= tonumber(A.scan_bound)
for k = FIXED + 1, #KEYS, STRIDE do
  local job, info, payload, span = KEYS[k], KEYS[k + 1], KEYS[k + 2], KEYS[k + 3]
  local items = tonumber(redis.call('HGET', info, F.ITEMS)) or 0
  if items > 0 and redis.call('HGET', job, 'status') == 'queued' and redis.call('HEXISTS', info, F.CANCELED) == 0 then
    local id = redis.call('HGET', info, F.ID)
    redis.call('HSET', job, 'status', 'canceled', 'ended_at', stamp)
    if not fair_forget(K.fair_tags, K.fair_backlog, id) and scan then redis.call('LREM', K.queue, 1, id) end
    redis.call('HSET', info, F.CANCELED, '1', F.ANNOUNCED, '1')
    redis.call('ZADD', K.canceled, now_s + ttl, id)
    local lines = chunk_lines(info, A.canceled_tail)
    local moved = {[chunk_from(info)] = -items, canceled = items}
    batch_progress(record, results, lines, moved, K.waiting, stamp, channel, hook)
    redis.call('DEL', payload, span)
    redis.call('EXPIRE', job, ttl)
    redis.call('EXPIRE', info, ttl)
    metrics_add(acc, tenant_incs(info, {['ended:canceled'] = items}))
  end
end
metrics_flush(acc, A.metrics, K.metrics, K.window)
redis.call('ZREMRANGEBYSCORE', K.canceled, '-inf', now_s)
if redis.call('EXISTS', K.canceled) == 1 then redis.call('EXPIRE', K.canceled, ttl) end
return {'ok'}
