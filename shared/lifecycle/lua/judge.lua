-- judge: A batch's outcomes join its version's sliding window of its last jobs; once the window holds min_jobs and
-- more than max_rate of them failed, the version is rolled back (once): the record says why, and an event on the
-- channel tells it. Returns {1, reason} when this call rolled it back, else {0, ''}.
-- outcomes: per item the model ran, in order, "1" (failed) or "0" followed by its job's tenant (an item refused as
-- bad input never comes: it says nothing of the model). ttl: the rollback's.
-- spread: "1" with several tenants, so that no tenant's jobs alone roll a version back for all: a tenant holds at
-- most half the window (past it, its own oldest outcomes leave first, so one tenant's flood never pushes the others'
-- out), and the verdict must also hold without any one tenant's jobs (each left out in turn, the others still
-- min_jobs, or half the window if that is less).
--
-- KEYS: outcomes, rollback
-- ARGV: outcomes[], window, max_rate, min_jobs, spread, ttl, model, version, weights, channel, now
-- uses: call_many

local window, max_rate, min_jobs = tonumber(A.window), tonumber(A.max_rate), tonumber(A.min_jobs)
local spread = A.spread == '1'
local cap = spread and math.ceil(window / 2) or window
-- The window newest first: this batch's outcomes (its last the newest), then those kept before.
local kept, held, dropped = {}, {}, false
local function keep(outcome)
  if #kept >= window then return end
  local tenant = string.sub(outcome, 2)
  local n = held[tenant] or 0
  if n < cap then
    held[tenant] = n + 1
    kept[#kept + 1] = outcome
  else
    dropped = true
  end
end
for i = #A.outcomes, 1, -1 do keep(A.outcomes[i]) end
for _, outcome in ipairs(redis.call('LRANGE', K.outcomes, 0, -1)) do keep(outcome) end
if #A.outcomes > 0 then
  if dropped then  -- an outcome left from the middle: the window written again
    redis.call('DEL', K.outcomes)
    call_many('RPUSH', K.outcomes, kept)
  else
    redis.call('LPUSH', K.outcomes, unpack(A.outcomes))
    redis.call('LTRIM', K.outcomes, 0, window - 1)
  end
  redis.call('EXPIRE', K.outcomes, A.ttl)
end
if redis.call('EXISTS', K.rollback) == 1 then return {0, ''} end
if #kept < min_jobs then return {0, ''} end
local failed, fails, tenants = 0, {}, 0
for _, outcome in ipairs(kept) do
  local tenant = string.sub(outcome, 2)
  if not fails[tenant] then
    fails[tenant], tenants = 0, tenants + 1
  end
  if string.sub(outcome, 1, 1) == '1' then
    failed = failed + 1
    fails[tenant] = fails[tenant] + 1
  end
end
if failed / #kept <= max_rate then return {0, ''} end
if spread then
  local rest_min = math.min(min_jobs, window - cap)
  for tenant, n in pairs(held) do
    local rest = #kept - n
    if rest < rest_min or (failed - fails[tenant]) / rest <= max_rate then return {0, ''} end
  end
end
local reason = string.format('%d of its last %d jobs failed (%.1f%%), more than the %.1f%% its rollback allows',
  failed, #kept, 100 * failed / #kept, 100 * max_rate)
if spread then reason = reason .. string.format(', from %d tenants, and without any one of them', tenants) end
redis.call('HSET', K.rollback, 'reason', reason, 'at', A.now, 'weights_sha256', A.weights)
redis.call('EXPIRE', K.rollback, A.ttl)
redis.call('PUBLISH', A.channel, cjson.encode({id = '', kind = 'rollback', model = A.model,
  version = tonumber(A.version), reason = reason}))
return {1, reason}
