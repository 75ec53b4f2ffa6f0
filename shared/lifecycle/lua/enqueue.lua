-- enqueue: The API's submit: an Idempotency-Key already used returns its job, a full queue refuses, else the
-- input, inferq's info hash and RQ's job hash are written and the job is queued. Nothing half-written.
-- id: the job's; max_length: the most jobs its queue may hold; idempotency: the value its Idempotency-Key
-- keeps (with idempotency_ttl; unused without the per-item key); info, job: the two hashes' fields.
--
-- KEYS: queue, queues, job, payload, info
-- KEYS per item: idempotency
-- ARGV: id, max_length, idempotency, idempotency_ttl, payload, payload_ttl, info_ttl, job_ttl, info<>, job<>

local idem = KEYS[FIXED + 1]
if idem then
  local existing = redis.call('GET', idem)
  if existing then return {'dup', existing} end
end
if redis.call('LLEN', K.queue) >= tonumber(A.max_length) then return {'full', ''} end
if idem then redis.call('SET', idem, A.idempotency, 'EX', A.idempotency_ttl) end
redis.call('SET', K.payload, A.payload, 'EX', A.payload_ttl)
redis.call('HSET', K.info, unpack(A.info))
redis.call('EXPIRE', K.info, A.info_ttl)
redis.call('SADD', K.queues, K.queue)
redis.call('HSET', K.job, unpack(A.job))
redis.call('EXPIRE', K.job, A.job_ttl)
redis.call('RPUSH', K.queue, A.id)
return {'ok', ''}
