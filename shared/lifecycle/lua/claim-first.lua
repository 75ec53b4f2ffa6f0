-- claim-first: Several queues: move the first waiting job into its intermediate list, trying the queues in the
-- order given; {1-based queue position, job id} or false. LMOVE needs Redis >= 6.2.
--
-- KEYS: (none fixed)
-- KEYS per item: queue, intermediate
-- ARGV: (none)

for i = 1, #KEYS, 2 do
  local id = redis.call('LMOVE', KEYS[i], KEYS[i + 1], 'LEFT', 'RIGHT')
  if id then return {(i + 1) / 2, id} end
end
return false
