-- rescue: A job popped but never started for over a minute (its worker died between pop and start, or lost the
-- claim's reply) back at the front of its queue, where RQ's cleanup would retry or fail it. It never ran, so no
-- retry is spent; `limit` bounds the rescues (a payload that kills its worker while it is prepared
-- ahead must not loop). 1 if rescued.
--
-- KEYS: intermediate, queue, job, info, first_seen
-- ARGV: id, limit

if redis.call('HGET', K.job, 'status') ~= 'queued' or redis.call('EXISTS', K.info) == 0 then return 0 end
if (tonumber(redis.call('HGET', K.info, F.RESCUED)) or 0) >= tonumber(A.limit) then return 0 end
if redis.call('LREM', K.intermediate, 1, A.id) == 0 then return 0 end
redis.call('HINCRBY', K.info, F.RESCUED, 1)
redis.call('DEL', K.first_seen)
redis.call('LPUSH', K.queue, A.id)
return 1
