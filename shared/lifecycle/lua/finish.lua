-- finish: End a batch. Per job (`jobs`: a JSON entry each, in its keys' order): a job whose hash is gone is not
-- re-created; one a client canceled, RQ's maintenance failed or requeued, or another worker took over meanwhile
-- keeps that state (its result is dropped); the rest get their status, RQ result, registry entry and info,
-- then their event and webhook. The started registry's entry always leaves; the input too unless the job will run
-- again. Each job that ends here adds its metrics (entry field `m`, JSON in a string; failures `f`), the
-- batch its own (`batch_metrics`): the sum of all of them comes ready-made (`all_metrics`), and is recounted only
-- if some job did not end. Returns {vanished ids, superseded ids}. span: the job's running attempt's trace span
-- (tracing on, workers/traces.py): gone with the job's end, its value kept in the info hash for the webhook's span;
-- read only when the finishing worker traces (`tracing` '1'): one a tracing worker left expires with its TTL.
--
-- KEYS: started, finished, failed, hook_queue, queues, worker, metrics, window, failures
-- KEYS per item: job, info, result, payload, attempts, delivery, record, results, batch_delivery, span
-- ARGV: now, channel, worker, working_s, tracing, @metrics, batch_metrics, all_metrics, @delivery, jobs[]
-- uses: announce, call_many

local now_s, channel, worker, tracing = tonumber(A.now), A.channel, A.worker, A.tracing == '1'
local m, tpl = A.metrics, A.delivery
local ended_metrics = {}
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
  local job, info, result, payload, attempts, delivery, record, results, batch_delivery, span =
    unpack(KEYS, k, k + STRIDE - 1)
  n = n + 1
  local j = cjson.decode(A.jobs[n])
  local keep_input = false
  local h = redis.call('HMGET', job, 'origin', 'status', 'worker_name')
  if not h[1] then
    vanished[#vanished + 1] = j.id
    gone[#gone + 1] = span
  else
    local status = h[2]
    local mine = status == 'started' and h[3] == worker
    local f = mine and redis.call('HMGET', info, F.CANCELED, F.ANNOUNCED, F.WEBHOOK)  -- one read for announce
    if not mine or f[1] then
      superseded[#superseded + 1] = j.id
      keep_input = status == 'queued' or (status == 'started' and not mine)
      if not keep_input then gone[#gone + 1] = span end  -- it ended (canceled, failed): no attempt runs now
    else
      redis.call('HSET', job, 'status', j.status, 'ended_at', j.ended_at)
      redis.call('EXPIRE', job, j.ttl)
      redis.call('XADD', result, 'MAXLEN', 10, '*', unpack(flat(j.result)))
      redis.call('EXPIRE', result, j.ttl)
      local ended = j.status == 'finished' and done or failed
      ended[#ended + 1] = now_s + j.ttl
      ended[#ended + 1] = j.id
      if not f[2] then j.info[F.ANNOUNCED] = '1' end
      local ran = tracing and redis.call('GET', span)
      if ran then
        j.info[F.ENDED_IN] = ran
        gone[#gone + 1] = span
      end
      redis.call('HSET', info, unpack(flat(j.info)))
      redis.call('EXPIRE', info, j.ttl)
      counts[j.status] = counts[j.status] + 1
      if j.m then ended_metrics[#ended_metrics + 1] = j.m end
      if j.f then
        for _, record in ipairs(j.f) do note_failure(K.failures, m, record) end
      end
      if j.lines then
        local hook = {delivery = batch_delivery, tpl = tpl, hook_queue = K.hook_queue, queues_set = K.queues}
        batch_progress(record, results, j.lines, j.moved, false, j.ended_at, channel, hook)
      end
      announce({info = info, attempts = attempts, delivery = delivery,
                job_id = j.id, model = j.model, status = j.status, ttl = j.ttl, stamp = j.ended_at,
                channel = channel, tpl = tpl, hook_queue = K.hook_queue, queues_set = K.queues, view = j.view,
                read = {f[2], f[3]}})
    end
  end
  running[#running + 1] = j.id .. ':' .. j.exec_id
  if not keep_input then gone[#gone + 1] = payload end
end
-- The batch's registry moves and deletions, one call each.
call_many('ZADD', K.finished, done)
call_many('ZADD', K.failed, failed)
call_many('ZREM', K.started, running)
call_many('DEL', false, gone)
-- Every job ended here (the common case): the batch's own metrics and every job's come summed. Otherwise
-- the batch's own, plus those of the jobs that did end.
local acc
if #vanished + #superseded == 0 then
  acc = cjson.decode(A.all_metrics)
else
  acc = cjson.decode(A.batch_metrics)
  for _, incs in ipairs(ended_metrics) do metrics_add(acc, cjson.decode(incs)) end
end
if counts.finished > 0 then redis.call('HINCRBY', K.worker, 'successful_job_count', counts.finished) end
if counts.failed > 0 then redis.call('HINCRBY', K.worker, 'failed_job_count', counts.failed) end
redis.call('HINCRBYFLOAT', K.worker, 'total_working_time', A.working_s)
metrics_flush(acc, m, K.metrics, K.window)
return {vanished, superseded}
