-- announce-failed: Jobs RQ's own maintenance failed (their worker died, no retries left): their event and webhook,
-- once, and counted. ttl: a failed job's; died_tail: a chunk's line tail (``lua.line_tail``); ids: per job (in
-- its keys' order) its id. Returns the ids told. span: its attempt's trace span (tracing on), gone with its end.
--
-- KEYS: hook_queue, queues
-- KEYS per item: job, info, attempts, delivery, payload, record, results, batch_delivery, metrics, window, failures, waiting, span
-- ARGV: ttl, stamp, channel, died_tail, @metrics, @delivery, ids[]
-- uses: announce

local ttl, stamp, channel = tonumber(A.ttl), A.stamp, A.channel
local m, tpl = A.metrics, A.delivery
local told, n = {}, 0
for k = FIXED + 1, #KEYS, STRIDE do
  local job, info, attempts, delivery, payload, record, results, batch_delivery, totals, window, failures, waiting, span =
    unpack(KEYS, k, k + STRIDE - 1)
  local hook = {delivery = batch_delivery, tpl = tpl, hook_queue = K.hook_queue, queues_set = K.queues}
  n = n + 1
  local id = A.ids[n]
  local items = tonumber(redis.call('HGET', info, F.ITEMS)) or 0
  if items > 0 and redis.call('HGET', job, 'status') == 'failed' and redis.call('HEXISTS', info, F.ANNOUNCED) == 0 then
    local lines = chunk_lines(info, A.died_tail)
    batch_progress(record, results, lines, {[chunk_from(info)] = -items, failed = items}, waiting, stamp, channel,
                   hook)
    redis.call('DEL', payload)
  end
  if redis.call('HGET', job, 'status') == 'failed' then
    redis.call('DEL', span)
    if announce({info = info, attempts = attempts, delivery = delivery,
                 job_id = id, model = redis.call('HGET', info, F.MODEL) or '', status = 'failed', ttl = ttl,
                 stamp = stamp, channel = channel, tpl = tpl, hook_queue = K.hook_queue, queues_set = K.queues}) then
      redis.call('EXPIRE', info, ttl)
      told[#told + 1] = id
      local weight = math.max(items, 1)
      metrics_flush(tenant_incs(info, {['ended:failed'] = weight, ['failed:WorkerDied'] = weight}), m, totals, window)
      note_reason(failures, m, 'WorkerDied',
                  'the worker running this job died (killed or crashed) and no retries were left', info)
    end
  end
end
return told
