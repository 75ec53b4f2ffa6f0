-- push-chunks: A slice of a batch's staged chunks into its queue, in order, each with the TTLs of a queued job from now;
-- the queue's count of waiting items grows by theirs (`items`; its TTL at least waiting_ttl). Workers may start them
-- at once. ids: the chunks' ids, in their keys' order. With several tenants (fair = '1') each chunk is queued at
-- its place in weighted fair order (lib/fair.lua: `tenant`, each chunk's `costs`: its items over the tenant's
-- weight; the list's `fair_window`), else at the tail.
--
-- A tenant's items (any tenant but `default`) are counted as accepted in their lane in the model's `totals`.
--
-- KEYS: queue, waiting, fair_tags, fair_state, totals, fair_backlog
-- KEYS per item: job, payload, info
-- ARGV: job_ttl, payload_ttl, info_ttl, waiting_ttl, items, fair, tenant, fair_window, lane, totals_ttl, ids[], costs[]
-- uses: fair

local n = 0
for k = FIXED + 1, #KEYS, STRIDE do
  redis.call('EXPIRE', KEYS[k], A.job_ttl)
  redis.call('EXPIRE', KEYS[k + 1], A.payload_ttl)
  redis.call('EXPIRE', KEYS[k + 2], A.info_ttl)
  n = n + 1
end
if A.fair == '1' then
  for i = 1, n do
    fair_place(K.queue, K.fair_tags, K.fair_state, K.fair_backlog, A.ids[i], A.tenant, tonumber(A.costs[i]),
               A.job_ttl, tonumber(A.fair_window))
  end
elseif n > 0 then
  redis.call('RPUSH', K.queue, unpack(A.ids, 1, n))
end
redis.call('INCRBY', K.waiting, A.items)
if A.tenant ~= 'default' then
  redis.call('HINCRBYFLOAT', K.totals, A.tenant .. '|accepted:' .. A.lane, A.items)
  redis.call('EXPIRE', K.totals, A.totals_ttl)
end
if redis.call('TTL', K.waiting) < tonumber(A.waiting_ttl) then redis.call('EXPIRE', K.waiting, A.waiting_ttl) end
return n
