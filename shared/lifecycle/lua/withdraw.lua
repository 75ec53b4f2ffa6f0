-- withdraw: A submit the API got no answer to (Redis did not answer in time, the connection broke, or no replica
-- confirmed it): a timeout is not a refusal, so its enqueue may have run, or may yet run, after the API gave up.
-- Before the client is told 503, the submit is withdrawn: `withdrawn` is set, so an enqueue that reaches Redis
-- later stores nothing, and one that ran already is undone while no worker has taken its job (its hashes, input,
-- place in the queue or its fair order, in-flight count, accepted count and Idempotency-Key go; a tenant's
-- jobs-per-minute quota keeps the use). Returns 'withdrawn' (it was queued), 'absent' (it never ran: it never
-- will) or 'taken' (a worker took it already, or a retry with its Idempotency-Key was told its ID, lua/enqueue.lua:
-- it stands, and the submit is answered as accepted).
-- ttl: the withdrawal's; lane, tenant: the submit's (accepted counts as `tenant|accepted:lane`).
--
-- KEYS: withdrawn, job, info, payload, queue, fair_tags, fair_backlog, in_flight, totals
-- KEYS per item: idempotency
-- ARGV: id, ttl, tenant, lane
-- uses: fair

redis.call('SET', K.withdrawn, '1', 'EX', A.ttl)
local status = redis.call('HGET', K.job, 'status')
if not status then return 'absent' end
if status ~= 'queued' then return 'taken' end
local idem = KEYS[FIXED + 1]
local kept = idem and redis.call('GET', idem)
local mine = kept and string.sub(kept, 1, #A.id + 1) == A.id .. ' '
if mine and string.sub(kept, -2) == ' +' then return 'taken' end  -- told to a retry: it stands
-- Queued: in its list (near the tail), its fair backlog, or popped but not started (the start finds it gone).
if not fair_forget(K.fair_tags, K.fair_backlog, A.id) then redis.call('LREM', K.queue, -1, A.id) end
redis.call('DEL', K.job, K.info, K.payload)
redis.call('ZREM', K.in_flight, A.id)
local accepted = A.tenant .. '|accepted:' .. A.lane
if redis.call('HEXISTS', K.totals, accepted) == 1 then redis.call('HINCRBYFLOAT', K.totals, accepted, -1) end
if mine then redis.call('DEL', idem) end
return 'withdrawn'
