-- rescue: A job popped but never started for over a minute (its worker died between pop and start, or lost the
-- claim's reply) back at the front of its queue, where RQ's cleanup would retry or fail it. It never ran, so no
-- retry is spent; ARGV[2] bounds the rescues (a payload that kills its worker while it is prepared
-- ahead must not loop). 1 if rescued. ARGV: id, limit.
--
-- KEYS: intermediate, queue, job, info, first_seen

if redis.call('HGET', KEYS[3], 'status') ~= 'queued' or redis.call('EXISTS', KEYS[4]) == 0 then return 0 end
if (tonumber(redis.call('HGET', KEYS[4], 'rescued')) or 0) >= tonumber(ARGV[2]) then return 0 end
if redis.call('LREM', KEYS[1], 1, ARGV[1]) == 0 then return 0 end
redis.call('HINCRBY', KEYS[4], 'rescued', 1)
redis.call('DEL', KEYS[5])
redis.call('LPUSH', KEYS[2], ARGV[1])
return 1
