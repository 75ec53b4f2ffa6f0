-- announce: shared by the scripts that end a job or a bulk batch (prepended to their source).
--
-- Shared by the scripts that end a job: tell the world once (the info hash's `announced` field),
-- by a pub/sub event and, when the job has one, a webhook delivery queued as an RQ job.
-- A delivery's id is derived from its job's, so it can be queued only once.

-- A bulk batch's delivery is queued for this subject + the batch's id (layout.BATCH_SUBJECT): the sender reads
-- from the delivery's id whether it delivers a job's end or a batch's.
local BATCH_SUBJECT = 'batch-'
local function queue_delivery(tpl, hook_queue, queues_set, delivery_key, job_id, stamp)
  local delivery_id = tpl.prefix .. job_id
  if redis.call('EXISTS', delivery_key) == 1 then return end
  redis.call('HSET', delivery_key, unpack(tpl.fields))
  redis.call('HSET', delivery_key, 'created_at', stamp, 'enqueued_at', stamp, 'description', 'webhook for ' .. job_id)
  redis.call('EXPIRE', delivery_key, tpl.ttl)
  redis.call('RPUSH', hook_queue, delivery_id)
  redis.call('SADD', queues_set, hook_queue)
end
-- The bulk items waiting in a queue (keys.waiting_items_key), the bulk lane's bound: moved by n. A count whose
-- key expired stays gone (an INCRBY would re-create it without a TTL), and never goes below 0.
local function waiting_add(key, n)
  if not key or n == 0 or redis.call('EXISTS', key) == 0 then return end
  if redis.call('INCRBY', key, n) < 0 then redis.call('SET', key, 0, 'KEEPTTL') end
end
-- A bulk batch ends once every item ended, and not while its upload is still being queued (`pending`: the
-- upload's last step ends it then). hook: where its own webhook delivery goes {delivery, tpl, hook_queue, queues_set}.
local function batch_end_if_done(record, results, stamp, channel, hook)
  local r = redis.call('HMGET', record, 'total', 'finished', 'failed', 'canceled', 'result_ttl', 'ended_at', 'id',
                       'model', 'pending')
  if r[6] or r[9] or not r[1] then return end
  if (tonumber(r[2]) or 0) + (tonumber(r[3]) or 0) + (tonumber(r[4]) or 0) >= (tonumber(r[1]) or 0) then
    redis.call('HSET', record, 'ended_at', stamp)
    redis.call('EXPIRE', record, tonumber(r[5]) or 1)
    redis.call('EXPIRE', results, tonumber(r[5]) or 1)
    emit(channel, cjson.encode({id = r[7], model = r[8], kind = 'batch', status = 'ended'}))
    if redis.call('HEXISTS', record, 'webhook') == 1 then
      queue_delivery(hook.tpl, hook.hook_queue, hook.queues_set, hook.delivery, BATCH_SUBJECT .. r[7], stamp)
    end
  end
end
-- A bulk batch's chunk ended some items: their result lines, its counts, and the batch's end once all ended.
-- lines: JSON strings; moved: {field = n} added to the record's counts (queued items also leave `waiting`, the
-- queue's count, or false).
local function batch_progress(record, results, lines, moved, waiting, stamp, channel, hook)
  if moved.queued then waiting_add(waiting, moved.queued) end
  -- A record that expired is not re-created without a TTL by the counts below.
  if redis.call('EXISTS', record) == 0 then return end
  for _, line in ipairs(lines) do redis.call('RPUSH', results, line) end
  -- Results written before the end (which sets their TTL) expire with the record, should it never end.
  if #lines > 0 and redis.call('TTL', results) == -1 then
    local left = redis.call('TTL', record)
    if left > 0 then redis.call('EXPIRE', results, left) end
  end
  for name, n in pairs(moved) do redis.call('HINCRBY', record, name, n) end
  batch_end_if_done(record, results, stamp, channel, hook)
end
-- The items of a chunk that ends without running (canceled, expired, its worker died): one line each. The info
-- hash holds their custom ids as the API encoded them (JSON strings, ASCII only, one a line) and `tail` is the
-- rest of each line, encoded by the caller: nothing a client sent is decoded here (Redis's cjson refuses some
-- escapes Python's json takes), so nothing it sent can fail a script after its first write.
local function chunk_lines(info, tail)
  local ids = redis.call('HGET', info, F.CUSTOM_IDS)
  local lines = {}
  if not ids then return lines end
  for id in string.gmatch(ids, '[^\n]+') do lines[#lines + 1] = '{"custom_id":' .. id .. tail end
  return lines
end
-- Where a chunk's items were counted: 'running' once a worker started it, else 'queued'.
local function chunk_from(info)
  if redis.call('HEXISTS', info, F.COUNTED) == 1 then return 'running' end
  return 'queued'
end
-- Metrics (shared/metrics.py): m is the scripts' @metrics argument {ttl, window_ttl, keep, failures_ttl, now}.
-- Increments are summed over the run and added once per field to a model's totals and its current window (each
-- refreshed with its TTL), and its recent failures.
-- A job's increments under its tenant's names when its info hash names one (shared/metrics.py TENANT_SEP).
local function tenant_incs(info, incs)
  local tenant = redis.call('HGET', info, F.TENANT)
  if not tenant then return incs end
  local out = {}
  for name, v in pairs(incs) do out[tenant .. '|' .. name] = v end
  return out
end
local function metrics_add(acc, incs)
  for name, v in pairs(incs) do acc[name] = (acc[name] or 0) + v end
end
local function metrics_write(acc, key, ttl)
  local any = false
  for name, v in pairs(acc) do
    redis.call('HINCRBYFLOAT', key, name, v)
    any = true
  end
  if any then redis.call('EXPIRE', key, ttl) end
end
local function metrics_flush(acc, m, totals, window)
  metrics_write(acc, totals, m.ttl)
  metrics_write(acc, window, m.window_ttl)
end
local function note_failure(key, m, record)
  redis.call('LPUSH', key, record)
  redis.call('LTRIM', key, 0, tonumber(m.keep) - 1)
  redis.call('EXPIRE', key, m.failures_ttl)
end
-- Under the job's tenant, when its info hash names one (shared/metrics.py failure_record): shown to it alone.
local function note_reason(key, m, reason, text, info)
  local tenant = redis.call('HGET', info, F.TENANT) or nil
  note_failure(key, m, cjson.encode({at = tonumber(m.now), reason = reason, error = text, tenant = tenant}))
end
-- A string as JSON text: as it is between quotes where it needs no escape (ids, model names, statuses: every one
-- inferq makes), else by cjson; an event is written per job, and cjson.encode of its table cost about a microsecond.
local function json_text(s)
  if string.find(s, '^[%w_@.:-]*$') then return '"' .. s .. '"' end
  return cjson.encode(s)
end
-- d: {info, attempts, delivery, job_id, model, status, ttl, stamp, channel, tpl, hook_queue, queues_set, view}
-- view: the job's view as JSON text (shared.jobs.ended_view), for a request waiting on it; spliced in as
-- it is, since cjson would re-encode its numbers with 14 digits.
-- read: the info hash's `announced` and `webhook` when the caller read them already (and set `announced`).
local function announce(d)
  local read = d.read
  if not read and redis.call('EXISTS', d.info) == 1 then
    if redis.call('HSETNX', d.info, F.ANNOUNCED, '1') == 0 then return false end
    read = {false, redis.call('HEXISTS', d.info, F.WEBHOOK) == 1}
  end
  if read then
    if read[1] then return false end
    if read[2] then
      redis.call('EXPIRE', d.attempts, d.ttl)
      queue_delivery(d.tpl, d.hook_queue, d.queues_set, d.delivery, d.job_id, d.stamp)
    end
  end
  local event = '{"id":' .. json_text(d.job_id) .. ',"model":' .. json_text(d.model) .. ',"status":'
    .. json_text(d.status) .. (d.view and (',"view":' .. d.view .. '}') or '}')
  emit(d.channel, event)
  return true
end
