-- enqueue: The API's submit: an Idempotency-Key already used returns its job, a full queue refuses, else the
-- input, inferq's info hash and RQ's job hash are written and the job is queued. Nothing half-written.
-- ARGV: job id, max length, idempotency value, its ttl, payload, payload ttl, info ttl, job ttl,
-- number of info fields, the info pairs, then the job hash pairs.
--
-- KEYS: queue, queues, job, payload, info
-- KEYS per item: idempotency

local idem = KEYS[6]
if idem then
  local existing = redis.call('GET', idem)
  if existing then return {'dup', existing} end
end
if redis.call('LLEN', KEYS[1]) >= tonumber(ARGV[2]) then return {'full', ''} end
if idem then redis.call('SET', idem, ARGV[3], 'EX', ARGV[4]) end
redis.call('SET', KEYS[4], ARGV[5], 'EX', ARGV[6])
local n = tonumber(ARGV[9])
redis.call('HSET', KEYS[5], unpack(ARGV, 10, 9 + 2 * n))
redis.call('EXPIRE', KEYS[5], ARGV[7])
redis.call('SADD', KEYS[2], KEYS[1])
redis.call('HSET', KEYS[3], unpack(ARGV, 10 + 2 * n, #ARGV))
redis.call('EXPIRE', KEYS[3], ARGV[8])
redis.call('RPUSH', KEYS[1], ARGV[1])
return {'ok', ''}
