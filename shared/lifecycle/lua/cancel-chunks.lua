-- cancel-chunks: A slice of a client's cancel of a bulk batch: each of these chunks still queued is canceled (a line per item);
-- chunks running finish. {'ok'}, {'missing'} (unknown, another owner's, or not yet visible) or {'ended'}.
-- A canceled chunk leaves the queue list here only while the slice's LREMs read at most ARGV[7] entries in all
-- (queue length x chunks); else its id stays until a worker pops it, and the start drops it (no longer queued).
-- KEYS: record, results, queue, canceled registry, the batch's webhook delivery, the webhook queue, the queues
-- set, the model's metrics and window, the queue's waiting items; per chunk: job, info, payload.
-- ARGV: owner ('' for any), canceled ttl, now, stamp, channel, a canceled item's line tail (``lua.line_tail``),
-- the scan bound, metrics group, delivery template.
--
-- KEYS: record, results, queue, canceled, delivery, hook_queue, queues, metrics, window, waiting
-- KEYS per item: job, info, payload
-- uses: announce

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
