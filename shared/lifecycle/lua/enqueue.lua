-- enqueue: The API's submit: an Idempotency-Key already used returns its job, a full queue refuses, a tenant past
-- its jobs-per-minute quota is refused with the milliseconds until it may submit again, else the input, inferq's
-- info hash and RQ's job hash are written and the job is queued. Nothing half-written; nothing of a refused job.
-- id: the job's; max_length: the most jobs its queue may hold; idempotency: the value its Idempotency-Key
-- keeps (with idempotency_ttl; unused without the per-item key); per_minute: the tenant's quota (0: none), held
-- in `rate` by the generic cell rate algorithm (a burst of per_minute jobs, then one every 60/per_minute s), on
-- Redis's clock so every API process counts alike; info, job: the two hashes' fields. With several tenants
-- (fair = '1') the job is queued at its place in weighted fair order (lib/fair.lua: `tenant`, its `cost` over its
-- weight, the list's `fair_window`; the jobs in its backlog count as queued), else at the tail.
--
-- in_flight_limit: the tenant's quota of jobs not yet ended (0: none), counted in `in_flight` (a sorted set: id ->
-- the time, in ms on Redis's clock, by which the job has surely ended, `live_ms` from now; the API drops the ones
-- that ended sooner when it reaches the quota: shared/jobs.py).
--
-- A tenant's job (any tenant but `default`, the one of a deployment without tenants) is counted as accepted in its
-- lane in the model's metrics `totals` (shared/metrics.py ACCEPTED): less its ended ones, what it has in flight.
--
-- withdrawn: set when the API gave up on this submit and withdrew it (lua/withdraw.lua): a late run stores nothing.
-- A key's job answered to a retry of the same request ('dup') is marked told (its value gains ' +'): a withdrawal of
-- the submit that stored it, still to run (its first caller was answered 503; the retry may reach another API
-- process, or a replica promoted with the job on it), then leaves the job standing, as one a worker took.
--
-- payload: the job's input, written by a plain SET sent just before this call on the same connection (an input
-- passed as an argument cost Redis about 40 us of the script's time per 34 KB, a SET 2): a refused submit deletes
-- it, and one whose input is not there ('lost': a SET refused, say for memory) queues nothing.
--
-- KEYS: queue, queues, job, payload, info, rate, fair_tags, fair_state, in_flight, totals, fair_backlog, withdrawn
-- KEYS per item: idempotency
-- ARGV: id, max_length, idempotency, idempotency_ttl, per_minute, in_flight_limit, live_ms, fair, tenant, cost, fair_window, lane, totals_ttl, info_ttl, job_ttl, info<>, job<>
-- uses: fair

local function refuse(verdict, detail)
  redis.call('DEL', K.payload)
  return {verdict, detail}
end
if redis.call('EXISTS', K.withdrawn) == 1 then return refuse('withdrawn', '') end
if redis.call('EXISTS', K.payload) == 0 then return {'lost', ''} end
local idem = KEYS[FIXED + 1]
if idem then
  local existing = redis.call('GET', idem)
  if existing then
    local space = string.find(existing, ' ', 1, true)
    if space and string.sub(existing, space) == string.sub(A.idempotency, #A.id + 1) then
      redis.call('SET', idem, existing .. ' +', 'KEEPTTL')
    end
    return refuse('dup', existing)
  end
end
if redis.call('LLEN', K.queue) + redis.call('ZCARD', K.fair_backlog) >= tonumber(A.max_length) then
  return refuse('full', '')
end
local per_minute, in_flight_limit = tonumber(A.per_minute), tonumber(A.in_flight_limit)
local now_ms = 0
if per_minute > 0 or in_flight_limit > 0 then
  local t = redis.call('TIME')
  now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
if in_flight_limit > 0 then
  redis.call('ZREMRANGEBYSCORE', K.in_flight, '-inf', now_ms)
  local count = redis.call('ZCARD', K.in_flight)
  if count >= in_flight_limit then return refuse('in_flight', tostring(count)) end
end
if per_minute > 0 then
  local interval = 60000 / per_minute
  local tat = tonumber(redis.call('GET', K.rate) or '0') or 0
  if tat < now_ms then tat = now_ms end
  local allowed_at = tat + interval - 60000
  if now_ms < allowed_at then return refuse('quota', tostring(math.ceil(allowed_at - now_ms))) end
  tat = tat + interval
  redis.call('SET', K.rate, string.format('%.3f', tat), 'PX', math.max(1, math.ceil(tat - now_ms)))
end
if in_flight_limit > 0 then
  local until_ms = now_ms + tonumber(A.live_ms)
  redis.call('ZADD', K.in_flight, until_ms, A.id)
  if redis.call('PTTL', K.in_flight) < tonumber(A.live_ms) then redis.call('PEXPIRE', K.in_flight, A.live_ms) end
end
if idem then redis.call('SET', idem, A.idempotency, 'EX', A.idempotency_ttl) end
redis.call('HSET', K.info, unpack(A.info))
redis.call('EXPIRE', K.info, A.info_ttl)
redis.call('SADD', K.queues, K.queue)
redis.call('HSET', K.job, unpack(A.job))
redis.call('EXPIRE', K.job, A.job_ttl)
if A.tenant ~= 'default' then
  redis.call('HINCRBYFLOAT', K.totals, A.tenant .. '|accepted:' .. A.lane, 1)
  redis.call('EXPIRE', K.totals, A.totals_ttl)
end
if A.fair == '1' then
  fair_place(K.queue, K.fair_tags, K.fair_state, K.fair_backlog, A.id, A.tenant, tonumber(A.cost), A.job_ttl,
             tonumber(A.fair_window))
else
  redis.call('RPUSH', K.queue, A.id)
end
return {'ok', ''}
