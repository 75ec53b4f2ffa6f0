-- finish: End a batch. Per job (`jobs`, in its keys' order): a job whose hash is gone is not
-- re-created; one a client canceled, RQ's maintenance failed or requeued, or another worker took over meanwhile
-- keeps that state (its result is dropped); the rest get their status, RQ result, registry entry and info,
-- then their event and webhook. The started registry's entry always leaves; the input too unless the job will run
-- again. Each job that ends here adds its metrics (`m`, JSON in a string, '' for none), the
-- batch its own (`batch_metrics`): the sum of all of them comes ready-made (`all_metrics`), and is recounted only
-- if some job did not end. Returns {vanished ids, superseded ids}. span: the job's running attempt's trace span
-- (tracing on, workers/traces.py): gone with the job's end, its value kept in the info hash for the webhook's span;
-- read only when the finishing worker traces (`tracing` '1'): one a tracing worker left expires with its TTL.
--
-- KEYS: started, finished, failed, hook_queue, queues, worker, metrics, window, failures
-- KEYS per item: job, info, result, payload, attempts, delivery, record, results, batch_delivery, span
-- A job's `result` and `info` come as the flat field/value lists XADD and HSET take, its `view` as JSON text ('' for
-- none); `rare` is '' or JSON holding what few jobs have: failure records `f`, a bulk chunk's `lines` and `moved`.
--
-- ARGV: now, channel, worker, working_s, tracing, @metrics, batch_metrics, all_metrics, @delivery, jobs[id, exec_id, status, ttl, ended_at, model, result<>, info<>, view, m, rare]
-- uses: announce, call_many

local now_s, channel, worker, tracing = tonumber(A.now), A.channel, A.worker, A.tracing == '1'
local m, tpl = A.metrics, A.delivery
local ended_metrics = {}
local J = A.jobs
-- What announce reads of each job's end: one table for the batch, its job's fields set in turn.
local told = {channel = channel, tpl = tpl, hook_queue = K.hook_queue, queues_set = K.queues, read = {}}
local vanished, superseded = {}, {}
local done, failed, running, gone = {}, {}, {}, {}
local counts = {finished = 0, failed = 0}
local n = 0
for k = FIXED + 1, #KEYS, STRIDE do
  local job, info, result, payload, attempts, delivery, record, results, batch_delivery, span =
    unpack(KEYS, k, k + STRIDE - 1)
  n = n + 1
  local id, exec_id, ttl, ended_at = J.id[n], J.exec_id[n], tonumber(J.ttl[n]), J.ended_at[n]
  local keep_input = false
  local h = redis.call('HMGET', job, 'origin', 'status', 'worker_name')
  if not h[1] then
    vanished[#vanished + 1] = id
    gone[#gone + 1] = span
  else
    local status = h[2]
    local mine = status == 'started' and h[3] == worker
    local f = mine and redis.call('HMGET', info, F.CANCELED, F.ANNOUNCED, F.WEBHOOK)  -- one read for announce
    if not mine or f[1] then
      superseded[#superseded + 1] = id
      keep_input = status == 'queued' or (status == 'started' and not mine)
      if not keep_input then gone[#gone + 1] = span end  -- it ended (canceled, failed): no attempt runs now
    else
      local ended_as, fields = J.status[n], J.info[n]
      redis.call('HSET', job, 'status', ended_as, 'ended_at', ended_at)
      redis.call('EXPIRE', job, ttl)
      redis.call('XADD', result, 'MAXLEN', 10, '*', unpack(J.result[n]))
      redis.call('EXPIRE', result, ttl)
      local ended = ended_as == 'finished' and done or failed
      ended[#ended + 1] = now_s + ttl
      ended[#ended + 1] = id
      if not f[2] then fields[#fields + 1] = F.ANNOUNCED; fields[#fields + 1] = '1' end
      local ran = tracing and redis.call('GET', span)
      if ran then
        fields[#fields + 1] = F.ENDED_IN; fields[#fields + 1] = ran
        gone[#gone + 1] = span
      end
      if #fields > 0 then redis.call('HSET', info, unpack(fields)) end
      redis.call('EXPIRE', info, ttl)
      counts[ended_as] = counts[ended_as] + 1
      if J.m[n] ~= '' then ended_metrics[#ended_metrics + 1] = J.m[n] end
      if J.rare[n] ~= '' then
        local rare = cjson.decode(J.rare[n])
        for _, failure in ipairs(rare.f or {}) do note_failure(K.failures, m, failure) end
        if rare.lines then
          local hook = {delivery = batch_delivery, tpl = tpl, hook_queue = K.hook_queue, queues_set = K.queues}
          batch_progress(record, results, rare.lines, rare.moved, false, ended_at, channel, hook)
        end
      end
      local view = J.view[n]
      told.info, told.attempts, told.delivery, told.job_id, told.model = info, attempts, delivery, id, J.model[n]
      told.status, told.ttl, told.stamp, told.view = ended_as, ttl, ended_at, view ~= '' and view or nil
      told.read[1], told.read[2] = f[2], f[3]
      announce(told)
    end
  end
  running[#running + 1] = id .. ':' .. exec_id
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
