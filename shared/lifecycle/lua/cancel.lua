-- cancel: A client's cancel of a queued or started job. Returns {'ok'}, {'missing'}, {'moved'} (its origin
-- is not the queue the caller read: read again) or {'conflict', status}.
-- owner: '' for any; origin: the queue the caller read from the job's hash; ttl: a canceled job's.
--
-- span: its running attempt's trace span (tracing on), gone with its end.
--
-- fair_tags, fair_backlog: the queue's fair order (lib/fair.lua), which the job leaves.
--
-- KEYS: job, info, payload, queue, started, canceled, attempts, delivery, hook_queue, queues, metrics, window, span, fair_tags, fair_backlog
-- ARGV: id, owner, origin, ttl, now, stamp, channel, @metrics, @delivery
-- uses: announce, fair

local job, info, id = K.job, K.info, A.id
local ttl, now_s, stamp = tonumber(A.ttl), tonumber(A.now), A.stamp
if redis.call('HEXISTS', job, 'status') == 0 or redis.call('HEXISTS', job, 'origin') == 0 then return {'missing'} end
if A.owner ~= '' and redis.call('HGET', info, F.OWNER) ~= A.owner then return {'missing'} end
if redis.call('HGET', job, 'origin') ~= A.origin then return {'moved'} end
local status = redis.call('HGET', job, 'status')
if status == 'finished' or status == 'failed' or status == 'stopped' or status == 'canceled' then
  return {'conflict', status}
end
redis.call('HSET', job, 'status', 'canceled', 'ended_at', stamp)
if not fair_forget(K.fair_tags, K.fair_backlog, id) then redis.call('LREM', K.queue, 0, id) end
local exec_id = redis.call('HGET', job, 'inferq_execution')  -- a started job's entry in the started registry
if exec_id then redis.call('ZREM', K.started, id .. ':' .. exec_id) end
redis.call('HSET', info, F.CANCELED, '1')
redis.call('ZADD', K.canceled, now_s + ttl, id)
redis.call('ZREMRANGEBYSCORE', K.canceled, '-inf', now_s)
redis.call('EXPIRE', K.canceled, ttl)
redis.call('EXPIRE', job, ttl)
redis.call('EXPIRE', info, ttl)
redis.call('DEL', K.payload, K.span)
announce({info = info, attempts = K.attempts, delivery = K.delivery, job_id = id,
          model = redis.call('HGET', info, F.MODEL) or '', status = 'canceled', ttl = ttl, stamp = stamp,
          channel = A.channel, tpl = A.delivery, hook_queue = K.hook_queue, queues_set = K.queues})
metrics_flush(tenant_incs(info, {['ended:canceled'] = 1}), A.metrics, K.metrics, K.window)
return {'ok'}
