-- fair: weighted fair order between tenants in a queue (prepended to the scripts that queue jobs).

-- Queue `id` at its place in weighted fair order (start-time fair queueing), so the workers' claims, which take
-- from the head, serve the tenants with waiting jobs in proportion to their weights and no tenant waits behind
-- another's backlog. A job's tag is its virtual start: max(the head's tag, where its tenant's last job ends), and
-- its tenant's next starts `cost` (1 / weight a job) later; it goes before the first waiting job with a higher tag
-- (LINSERT scans from the head: a light tenant's job lands near it), at the tail when none has one. The RQ list
-- stays the one queue (`rq info` counts it, the claims are unchanged); `tags` (a sorted set: id -> tag) and `state`
-- (a hash: tenant -> where its last job ends, ' v' -> the head's tag) only place jobs, are dropped once the queue
-- is empty and expire with `ttl`. A job placed otherwise (RQ's requeue, a
-- batch given back to the front) has no tag and is passed over; the tag of one that left the list is dropped when
-- found below the head's or as a pivot.
local function fair_place(queue, tags, state, id, tenant, cost, ttl)
  local v = 0
  local head = redis.call('LINDEX', queue, 0)
  if not head then
    redis.call('DEL', tags, state)  -- an empty queue: every tenant starts level
  else
    v = tonumber(redis.call('ZSCORE', tags, head) or redis.call('HGET', state, ' v') or '0')
    redis.call('ZREMRANGEBYSCORE', tags, '-inf', '(' .. string.format('%.17g', v))
  end
  local start = math.max(v, tonumber(redis.call('HGET', state, tenant) or '0'))
  local text = string.format('%.17g', start)
  redis.call('HSET', state, ' v', string.format('%.17g', v), tenant, string.format('%.17g', start + cost))
  local placed = false
  while not placed do
    local after = redis.call('ZRANGEBYSCORE', tags, '(' .. text, '+inf', 'LIMIT', 0, 1)[1]
    if not after then
      redis.call('RPUSH', queue, id)
      placed = true
    elseif redis.call('LINSERT', queue, 'BEFORE', after, id) > 0 then
      placed = true
    else
      redis.call('ZREM', tags, after)  -- it left the queue (claimed from the middle, canceled)
    end
  end
  redis.call('ZADD', tags, text, id)
  redis.call('EXPIRE', tags, ttl)
  redis.call('EXPIRE', state, ttl)
end
