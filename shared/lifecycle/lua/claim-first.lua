-- claim-first: Several queues: move the first waiting job into its intermediate list, trying the queues in the
-- order given; {1-based queue position, job id} or false. A queue in fair order (lib/fair.lua) forgets the job's
-- tag and takes the next of its backlog into its list (at most `window` long). LMOVE needs Redis >= 6.2.
--
-- KEYS: (none fixed)
-- KEYS per item: queue, intermediate, fair_tags, fair_backlog
-- ARGV: window
-- uses: fair

local window = tonumber(A.window)
for i = 1, #KEYS, STRIDE do
  local queue, intermediate, tags, backlog = KEYS[i], KEYS[i + 1], KEYS[i + 2], KEYS[i + 3]
  local id = redis.call('LMOVE', queue, intermediate, 'LEFT', 'RIGHT')
  if not id and fair_refill(queue, tags, backlog, window, 1) > 0 then
    id = redis.call('LMOVE', queue, intermediate, 'LEFT', 'RIGHT')
  end
  if id then
    redis.call('ZREM', tags, id)
    fair_refill(queue, tags, backlog, window, 1)
    return {(i - 1) / STRIDE + 1, id}
  end
end
return false
