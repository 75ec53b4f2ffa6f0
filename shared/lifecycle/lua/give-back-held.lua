-- give-back-held: Popped jobs that never started back at the front of their queue, in order; one no longer in the
-- intermediate list (RQ's cleanup took it) is left alone. ARGV: the ids.
--
-- KEYS: queue, intermediate

local back = {}
for i = 1, #ARGV do
  if redis.call('LREM', KEYS[2], 1, ARGV[i]) > 0 then back[#back + 1] = ARGV[i] end
end
for i = #back, 1, -1 do redis.call('LPUSH', KEYS[1], back[i]) end
return back
