-- give-back: Started jobs that will not finish here (a forced stop) back at the front of their queue, as they
-- were; one no longer started by this worker (canceled, taken over, gone) is left as it is.
-- jobs: per job (in its keys' order) its id and execution id.
--
-- KEYS: queue, started
-- KEYS per item: job
-- ARGV: worker, jobs[id, execution]

local back, n = {}, 0
for k = FIXED + 1, #KEYS, STRIDE do
  local job = KEYS[k]
  n = n + 1
  local id, exec_id = A.jobs.id[n], A.jobs.execution[n]
  redis.call('ZREM', K.started, id .. ':' .. exec_id)
  if redis.call('HGET', job, 'status') == 'started' and redis.call('HGET', job, 'worker_name') == A.worker then
    redis.call('HSET', job, 'status', 'queued')
    back[#back + 1] = id
  end
end
for i = #back, 1, -1 do redis.call('LPUSH', K.queue, back[i]) end
return back
