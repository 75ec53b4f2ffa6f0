-- cancel: A client's cancel of a queued or started job. Returns {'ok'}, {'missing'}, {'moved'} (its origin
-- is not the queue the caller read: read again) or {'conflict', status}.
-- ARGV: job id, owner ('' for any), origin, ttl, now, stamp, channel, metrics group, delivery template.
--
-- KEYS: job, info, payload, queue, started, canceled, executions, attempts, delivery, hook_queue, queues, metrics, window
-- uses: announce

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
