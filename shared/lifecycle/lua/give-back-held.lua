-- give-back-held: Popped jobs that never started back at the front of their queue, in order; one no longer in the
-- intermediate list (RQ's cleanup took it) is left alone.
--
-- KEYS: queue, intermediate
-- ARGV: ids[]

local back = {}
for _, id in ipairs(A.ids) do
  if redis.call('LREM', K.intermediate, 1, id) > 0 then back[#back + 1] = id end
end
for i = #back, 1, -1 do redis.call('LPUSH', K.queue, back[i]) end
return back
