-- publish-batch: Every chunk is queued: the batch becomes visible, its Idempotency-Key names it for the key's whole TTL, and
-- a batch whose items all ended meanwhile ends here (its event and webhook, once). 'ok' or 'missing'.
-- KEYS: record, results, idempotency key (the record again when none, untouched), the batch's webhook
-- delivery, the webhook queue, the queues set. ARGV: has idempotency, its value, its ttl, stamp, channel,
-- delivery template.
--
-- KEYS: record, results, idempotency, delivery, hook_queue, queues
-- uses: announce

local tpl = read_template(6)
if redis.call('EXISTS', KEYS[1]) == 0 then return 'missing' end
if ARGV[1] == '1' then
  local held = redis.call('GET', KEYS[3])
  if held == ARGV[2] then
    redis.call('EXPIRE', KEYS[3], ARGV[3])
  elseif not held then
    redis.call('SET', KEYS[3], ARGV[2], 'EX', ARGV[3])
  end
end
redis.call('HDEL', KEYS[1], 'pending')
local hook = {delivery = KEYS[4], tpl = tpl, hook_queue = KEYS[5], queues_set = KEYS[6]}
batch_end_if_done(KEYS[1], KEYS[2], ARGV[4], ARGV[5], hook)
return 'ok'
