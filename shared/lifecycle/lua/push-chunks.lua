-- push-chunks: A slice of a batch's staged chunks into its queue, in order, each with the TTLs of a queued job from now;
-- the queue's count of waiting items grows by theirs (its TTL at least ARGV[4]). Workers may start them at once.
-- KEYS: queue, waiting items; per chunk: job, payload, info. ARGV: job ttl, payload ttl, info ttl, waiting
-- ttl, the slice's items, then the chunk ids.
--
-- KEYS: queue, waiting
-- KEYS per item: job, payload, info

local ids, n = {}, 0
for k = FIXED + 1, #KEYS, STRIDE do
  redis.call('EXPIRE', KEYS[k], ARGV[1])
  redis.call('EXPIRE', KEYS[k + 1], ARGV[2])
  redis.call('EXPIRE', KEYS[k + 2], ARGV[3])
  n = n + 1
  ids[n] = ARGV[5 + n]
end
if n > 0 then redis.call('RPUSH', KEYS[1], unpack(ids)) end
redis.call('INCRBY', KEYS[2], ARGV[5])
if redis.call('TTL', KEYS[2]) < tonumber(ARGV[4]) then redis.call('EXPIRE', KEYS[2], ARGV[4]) end
return n
