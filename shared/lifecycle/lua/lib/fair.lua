-- fair: weighted fair order between tenants in a queue (prepended to the scripts that queue, claim or cancel jobs).

-- Jobs are served in weighted fair order (start-time fair queueing), so the workers' claims, which take from the
-- head, serve the tenants with waiting jobs in proportion to their weights and no tenant waits behind another's
-- backlog. A job's tag is its virtual start: max(the head's tag, where its tenant's last job ends), and its tenant's
-- next starts `cost` (1 / weight a job) later. `state` (a hash: tenant -> where its last job ends, ' v' -> the
-- head's tag) holds the tenants' places.
--
-- The order's first `window` jobs are the RQ list itself, in order (`rq info` counts them, the claims are
-- unchanged), in order of tag then id (equal tags in id order, as the sorted sets hold them): a job placed among
-- them goes before the one after it in `tags` (a sorted set id -> tag; LINSERT then reads at most the window). The rest wait in `backlog` (a sorted set id -> tag): a job
-- whose tag is past the list's last goes there once the list is full, and as the list's jobs are claimed the
-- backlog's lowest tags move to its tail. So every placement, claim and cancel does bounded work whatever the queue
-- holds: at most the window's length in the list, O(log n) in the sorted sets. A job leaves `tags` or `backlog`
-- as it leaves the queue (claimed, canceled); one that left otherwise (RQ's requeue or rq-dashboard) is passed
-- over once found, and those below the head's tag are dropped. A job placed otherwise (RQ's requeue, a batch
-- given back to the front) has no tag and is passed over. All three keys are dropped once the queue is empty, and
-- expire with `ttl`.

local function fair_text(x)
  return string.format('%.17g', x)
end

-- Up to n of the backlog's jobs, lowest tag first, to the list's tail, while the list holds fewer than window:
-- how many moved.
local function fair_refill(queue, tags, backlog, window, n)
  local room = math.min(n, window - redis.call('LLEN', queue))
  if room <= 0 or redis.call('EXISTS', backlog) == 0 then return 0 end
  local ttl = redis.call('PTTL', backlog)
  local moved = redis.call('ZPOPMIN', backlog, room)
  for i = 1, #moved, 2 do
    redis.call('RPUSH', queue, moved[i])
    redis.call('ZADD', tags, moved[i + 1], moved[i])
  end
  if ttl > 0 and redis.call('PTTL', tags) < ttl then redis.call('PEXPIRE', tags, ttl) end
  return #moved / 2
end

-- A job that left the queue without running (canceled, withdrawn) leaves the order: true if it was in the backlog
-- (so not in the list).
local function fair_forget(tags, backlog, id)
  redis.call('ZREM', tags, id)
  return redis.call('ZREM', backlog, id) == 1
end

-- Queue `id` at its place in weighted fair order.
local function fair_place(queue, tags, state, backlog, id, tenant, cost, ttl, window)
  local v = 0
  local head = redis.call('LINDEX', queue, 0)
  if not head and fair_refill(queue, tags, backlog, window, 1) > 0 then head = redis.call('LINDEX', queue, 0) end
  if not head then
    redis.call('DEL', tags, state, backlog)  -- an empty queue: every tenant starts level
  else
    v = tonumber(redis.call('ZSCORE', tags, head) or redis.call('HGET', state, ' v') or '0')
    -- Claimed by a blocking move (no script): its tag is below the head's.
    redis.call('ZREMRANGEBYSCORE', tags, '-inf', '(' .. fair_text(v))
  end
  local start = math.max(v, tonumber(redis.call('HGET', state, tenant) or '0'))
  local text = fair_text(start)
  redis.call('HSET', state, ' v', fair_text(v), tenant, fair_text(start + cost))
  -- The list is in (tag, id) order, as `tags` and `backlog` are: its place is before the job after it in `tags`.
  redis.call('ZADD', tags, text, id)
  local rank = redis.call('ZRANK', tags, id)
  local full = redis.call('ZCARD', backlog) > 0 or redis.call('LLEN', queue) >= window
  if full and rank == redis.call('ZCARD', tags) - 1 then
    redis.call('ZREM', tags, id)  -- past every job in the list: it waits in the backlog
    redis.call('ZADD', backlog, text, id)
  else
    local placed = false
    for _ = 1, 3 do  -- a job after it that left the list some other way is passed over, a few at most
      local after = redis.call('ZRANGE', tags, rank + 1, rank + 1)[1]
      if not after then break end
      if redis.call('LINSERT', queue, 'BEFORE', after, id) > 0 then
        placed = true
        break
      end
      redis.call('ZREM', tags, after)
    end
    if not placed then redis.call('RPUSH', queue, id) end
    -- A full list hands its last job to the backlog: the list stays the order's first `window`.
    if redis.call('LLEN', queue) > window then
      local tail = redis.call('LINDEX', queue, -1)
      local score = redis.call('ZSCORE', tags, tail)
      if score then  -- untagged (RQ put it there), it stays
        redis.call('RPOP', queue)
        redis.call('ZREM', tags, tail)
        redis.call('ZADD', backlog, score, tail)
      end
    end
  end
  redis.call('EXPIRE', tags, ttl)
  redis.call('EXPIRE', state, ttl)
  redis.call('EXPIRE', backlog, ttl)
  fair_refill(queue, tags, backlog, window, 2)  -- a list a cancel left short fills again
end
