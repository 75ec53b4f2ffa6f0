-- queue-batch: A staged upload becomes a batch, hidden (`pending`) until its chunks are queued: unless an Idempotency-Key
-- already names a batch ('dup', with its value), the staged chunks expired ('stale': the upload took longer than
-- their TTL), or the lane has no room for it ('full'), the key is taken for a while, the record written and the
-- staged lists kept as long as it. Reads and checks come before the first write.
-- idempotency: the key (the record again when there is none, untouched); has_idempotency "1" or "0", the value it
-- keeps and its ttl while pending. max_chunks, max_items: the most chunks the queue may hold and items it may have
-- waiting ('' for no such bound; the chunks in the queue's fair backlog, lib/fair.lua, count as queued); chunks,
-- items: this batch's. record: the batch record's fields.
-- first_job: the first chunk's job hash (gone when the staged chunks expired). lines_limit: the tenant's quota of
-- upload lines waiting (0: none), against `tenant_lines` (a hash: batch id -> its lines still waiting, as last
-- counted; the API brings them down to the records' when it nears the quota): past it, 'lines' and the count.
--
-- KEYS: queue, queues, record, chunks, results, ids, idempotency, waiting, first_job, tenant_lines, fair_backlog
-- ARGV: has_idempotency, idempotency_value, idempotency_ttl, record_ttl, max_chunks, max_items, chunks, items, batch, lines_limit, record<>

if A.has_idempotency == '1' then
  local existing = redis.call('GET', K.idempotency)
  if existing then return {'dup', existing} end
end
if redis.call('EXISTS', K.first_job) == 0 then return {'stale', ''} end
local chunks, items = tonumber(A.chunks), tonumber(A.items)
local queued = redis.call('LLEN', K.queue) + redis.call('ZCARD', K.fair_backlog)
if A.max_chunks ~= '' and queued + chunks > tonumber(A.max_chunks) then return {'full', ''} end
if A.max_items ~= '' and (tonumber(redis.call('GET', K.waiting)) or 0) + items > tonumber(A.max_items) then
  return {'full', ''}
end
local lines_limit = tonumber(A.lines_limit)
if lines_limit > 0 then
  local waiting = 0
  for _, n in ipairs(redis.call('HVALS', K.tenant_lines)) do waiting = waiting + (tonumber(n) or 0) end
  if waiting + items > lines_limit then return {'lines', tostring(waiting)} end
  redis.call('HSET', K.tenant_lines, A.batch, items)
  if redis.call('TTL', K.tenant_lines) < tonumber(A.record_ttl) then redis.call('EXPIRE', K.tenant_lines, A.record_ttl) end
end
if A.has_idempotency == '1' then redis.call('SET', K.idempotency, A.idempotency_value, 'EX', A.idempotency_ttl) end
redis.call('HSET', K.record, unpack(A.record))
redis.call('EXPIRE', K.record, A.record_ttl)
redis.call('EXPIRE', K.chunks, A.record_ttl)
if redis.call('EXISTS', K.results) == 1 then redis.call('EXPIRE', K.results, A.record_ttl) end
redis.call('UNLINK', K.ids)
redis.call('SADD', K.queues, K.queue)
return {'ok', ''}
