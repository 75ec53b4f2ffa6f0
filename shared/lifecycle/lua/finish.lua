-- finish: End a batch. Per job (ARGV: a JSON entry): a job whose hash is gone is not re-created; one a
-- client canceled, RQ's maintenance failed or requeued, or another worker took over meanwhile keeps
-- that state (its result is dropped); the rest get their status, RQ result, registry entry and info,
-- then their event and webhook. The execution always leaves; the input too unless the job will run
-- again. Each job that ends here adds its metrics (entry field `m`, JSON in a string; failures `f`), the
-- batch its own: the sum of all of them comes ready-made, and is recounted only if some job did not end.
-- Returns {vanished ids, superseded ids}.
-- ARGV: now, channel, worker, working seconds, metrics group, the batch's own metrics (JSON), those plus
-- every job's (JSON), delivery template, then one JSON entry per job.
--
-- KEYS: started, finished, failed, hook_queue, queues, worker, metrics, window, failures
-- KEYS per item: job, info, result, payload, execution, executions, attempts, delivery, record, results, batch_delivery
-- uses: announce, call_many

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
