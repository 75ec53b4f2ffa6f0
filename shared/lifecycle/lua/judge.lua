-- judge: A batch's outcomes join its version's sliding window of its last jobs; once the window holds min_jobs and
-- more than max_rate of them failed, the version is rolled back (once): the record says why, and an event on the
-- channel tells it. Returns {1, reason} when this call rolled it back, else {0, ''}.
-- outcomes: per item "1" (failed) or "0"; rate_text: how the reason prints the threshold; ttl: the rollback's.
--
-- KEYS: outcomes, rollback
-- ARGV: outcomes[], window, max_rate, min_jobs, ttl, model, version, weights, channel, now

if #A.outcomes > 0 then
  redis.call('LPUSH', K.outcomes, unpack(A.outcomes))
  redis.call('LTRIM', K.outcomes, 0, tonumber(A.window) - 1)
  redis.call('EXPIRE', K.outcomes, A.ttl)
end
if redis.call('EXISTS', K.rollback) == 1 then return {0, ''} end
local last = redis.call('LRANGE', K.outcomes, 0, -1)
if #last < tonumber(A.min_jobs) then return {0, ''} end
local failed = 0
for _, outcome in ipairs(last) do
  if outcome == '1' then failed = failed + 1 end
end
if failed / #last <= tonumber(A.max_rate) then return {0, ''} end
local reason = string.format('%d of its last %d jobs failed (%.1f%%), more than the %.1f%% its rollback allows',
  failed, #last, 100 * failed / #last, 100 * tonumber(A.max_rate))
redis.call('HSET', K.rollback, 'reason', reason, 'at', A.now, 'weights_sha256', A.weights)
redis.call('EXPIRE', K.rollback, A.ttl)
redis.call('PUBLISH', A.channel, cjson.encode({id = '', kind = 'rollback', model = A.model,
  version = tonumber(A.version), reason = reason}))
return {1, reason}
