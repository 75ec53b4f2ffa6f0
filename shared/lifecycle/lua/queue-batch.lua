-- queue-batch: A staged upload becomes a batch, hidden (`pending`) until its chunks are queued: unless an Idempotency-Key
-- already names a batch ('dup', with its value), the staged chunks expired ('stale': the upload took longer than
-- their TTL), or the lane has no room for it ('full'), the key is taken for a while, the record written and the
-- staged lists kept as long as it. Reads and checks come before the first write.
-- KEYS: queue, queues set, record, chunks list, results list, ids hash, idempotency key (the record again when
-- there is none, untouched), the queue's waiting items, the first chunk's job.
-- ARGV: has idempotency ("1"/"0"), its value, its ttl while pending, record ttl, the most chunks the queue may
-- hold ('' for no such bound), the most items it may have waiting ('' for none), chunks, items, record field
-- count, record pairs.
--
-- KEYS: queue, queues, record, chunks, results, ids, idempotency, waiting, first_job

if ARGV[1] == '1' then
  local existing = redis.call('GET', KEYS[7])
  if existing then return {'dup', existing} end
end
if redis.call('EXISTS', KEYS[9]) == 0 then return {'stale', ''} end
local chunks, items = tonumber(ARGV[7]), tonumber(ARGV[8])
if ARGV[5] ~= '' and redis.call('LLEN', KEYS[1]) + chunks > tonumber(ARGV[5]) then return {'full', ''} end
if ARGV[6] ~= '' and (tonumber(redis.call('GET', KEYS[8])) or 0) + items > tonumber(ARGV[6]) then
  return {'full', ''}
end
if ARGV[1] == '1' then redis.call('SET', KEYS[7], ARGV[2], 'EX', ARGV[3]) end
local n = tonumber(ARGV[9])
redis.call('HSET', KEYS[3], unpack(ARGV, 10, 9 + 2 * n))
redis.call('EXPIRE', KEYS[3], ARGV[4])
redis.call('EXPIRE', KEYS[4], ARGV[4])
if redis.call('EXISTS', KEYS[5]) == 1 then redis.call('EXPIRE', KEYS[5], ARGV[4]) end
redis.call('UNLINK', KEYS[6])
redis.call('SADD', KEYS[2], KEYS[1])
return {'ok', ''}
