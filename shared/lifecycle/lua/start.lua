-- start: Mark a batch started. Per job: out of the intermediate list; a job whose hash is gone is never
-- re-created (announced `expired` if its queue deadline passed unrun); one no longer queued or
-- flagged canceled is dropped; the rest enter the started registry under an execution id (`<id>:<execution>`, as
-- RQ writes it; the id is kept in the job hash's `inferq_execution`, for a cancel to find the entry: RQ's
-- per-job execution hashes are not written, two keys and six commands a job that no RQ tool reads) and are marked
-- started, with their hash, input and info outliving the job timeout. Returns per job {id, state}
-- and, for started ones, the hash fields, the input and the info hash. Expired jobs are counted.
-- score: the started registry's; stamp: now as RQ writes it;
-- now: epoch seconds; expired_tail: an expired chunk's line tail (``lua.line_tail``); jobs: per job (in its
-- keys' order) its id and its new execution's id. inputs: '1' to return each started job's input, '0' when the
-- worker read them ahead (its overlap: ``claims.read_inputs``), so they do not cross Redis a second time.
--
-- waiting: the queue's count of waiting bulk items (keys.waiting_items_key).
-- record, results: a bulk chunk's batch (for a single job, its info key again, untouched).
-- span: the job's attempt's trace span (tracing on), left by an attempt that never ended: gone with a vanished job.
--
-- KEYS: intermediate, started, hook_queue, queues, metrics, window, failures, waiting
-- KEYS per item: job, info, payload, attempts, delivery, record, results, batch_delivery, span
-- ARGV: score, job_ttl, worker, stamp, channel, model, now, expired_tail, inputs, @metrics, @delivery, jobs[id, execution]
-- uses: announce, call_many

local score, job_ttl = tonumber(A.score), tonumber(A.job_ttl)
local worker, stamp, channel, model, now_s = A.worker, A.stamp, A.channel, A.model, tonumber(A.now)
local m, tpl = A.metrics, A.delivery
local inputs = A.inputs == '1'
local acc = {}
local out, started, registry = {}, {}, {}
local n = 0
for k = FIXED + 1, #KEYS, STRIDE do
  local job, info, payload, attempts, delivery, record, results, batch_delivery, span =
    unpack(KEYS, k, k + STRIDE - 1)
  n = n + 1
  local id, exec_id = A.jobs.id[n], A.jobs.execution[n]
  redis.call('LREM', K.intermediate, 1, id)
  -- One read of each hash: origin, status and the fields the worker needs; the whole info hash, its flags read
  -- from it (and handed back as it is).
  local j = redis.call('HMGET', job, 'origin', 'status', 'enqueued_at', 'timeout', 'result_ttl', 'failure_ttl')
  local flat = redis.call('HGETALL', info)
  local flags = {}
  for i = 1, #flat, 2 do flags[flat[i]] = flat[i + 1] end
  local items = tonumber(flags[F.ITEMS]) or 0
  if not j[1] then
    local state = 'vanished'
    redis.call('DEL', span)
    if items > 0 and redis.call('HSETNX', info, F.ANNOUNCED, '1') == 1 then
      local lines = chunk_lines(info, A.expired_tail)
      local moved = {[chunk_from(info)] = -items, failed = items}
      local hook = {delivery = batch_delivery, tpl = tpl, hook_queue = K.hook_queue, queues_set = K.queues}
      batch_progress(record, results, lines, moved, K.waiting, stamp, channel, hook)
      redis.call('DEL', payload)
      state = 'expired'
      metrics_add(acc, tenant_incs(info, {['ended:expired'] = items, ['failed:Expired'] = items}))
      note_reason(K.failures, m, 'Expired', 'expired: still queued when the batch window ended', info)
    end
    -- Read before the chunk's lines were written: that wrote only `announced`.
    local deadline = tonumber(flags[F.DEADLINE] or '')
    if deadline and deadline <= now_s and not flags[F.BATCH_SIZE] and not flags[F.CANCELED] then
      local d = {info = info, attempts = attempts, delivery = delivery,
                 job_id = id, model = model, status = 'expired', ttl = redis.call('TTL', info), stamp = stamp,
                 channel = channel, tpl = tpl, hook_queue = K.hook_queue, queues_set = K.queues}
      if d.ttl < 1 then d.ttl = tpl.ttl end
      if announce(d) then
        state = 'expired'
        metrics_add(acc, tenant_incs(info, {['ended:expired'] = 1, ['failed:Expired'] = 1}))
        note_reason(K.failures, m, 'Expired', 'expired: still queued when its deadline passed; it never ran', info)
      end
    end
    out[n] = {id, state}
  elseif j[2] ~= 'queued' or flags[F.CANCELED] then
    out[n] = {id, 'dropped'}
  else
    registry[#registry + 1] = score
    registry[#registry + 1] = id .. ':' .. exec_id
    redis.call('HSET', job, 'last_heartbeat', stamp, 'status', 'started', 'started_at', stamp, 'worker_name', worker,
               'inferq_execution', exec_id)
    redis.call('EXPIRE', job, job_ttl)
    redis.call('EXPIRE', payload, job_ttl)
    redis.call('EXPIRE', info, job_ttl)
    if items > 0 and redis.call('HSETNX', info, F.COUNTED, '1') == 1 then
      waiting_add(K.waiting, -items)
      if redis.call('EXISTS', record) == 1 then  -- one that expired is not re-created without a TTL
        redis.call('HINCRBY', record, 'queued', -items)
        redis.call('HINCRBY', record, 'running', items)
        redis.call('HSETNX', record, 'started_at', stamp)
      end
      flat = redis.call('HGETALL', info)  -- with `counted`
    end
    out[n] = {id, 'started', {'started', j[3], j[4], j[5], j[6]}, inputs and redis.call('GET', payload) or false, flat}
    started[#started + 1] = id
  end
end
call_many('ZADD', K.started, registry)  -- RQ's started registry: one call for the batch
-- Each job's event, its tail encoded once for the batch.
local tail = ',"model":' .. json_text(model) .. ',"status":"started","batch_size":' .. #started .. '}'
for _, id in ipairs(started) do redis.call('PUBLISH', channel, '{"id":' .. json_text(id) .. tail) end
metrics_flush(acc, m, K.metrics, K.window)
return out
