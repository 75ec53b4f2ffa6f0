-- publish-batch: Every chunk is queued: the batch becomes visible, its Idempotency-Key names it for the key's whole TTL, and
-- a batch whose items all ended meanwhile ends here (its event and webhook, once). 'ok' or 'missing'.
-- idempotency: the key (the record again when none, untouched); has_idempotency "1" or "0", and the value the
-- key keeps (idempotency_value, for idempotency_ttl). delivery: the batch's webhook delivery.
--
-- KEYS: record, results, idempotency, delivery, hook_queue, queues
-- ARGV: has_idempotency, idempotency_value, idempotency_ttl, stamp, channel, @delivery
-- uses: announce

if redis.call('EXISTS', K.record) == 0 then return 'missing' end
if A.has_idempotency == '1' then
  local held = redis.call('GET', K.idempotency)
  if held == A.idempotency_value then
    redis.call('EXPIRE', K.idempotency, A.idempotency_ttl)
  elseif not held then
    redis.call('SET', K.idempotency, A.idempotency_value, 'EX', A.idempotency_ttl)
  end
end
redis.call('HDEL', K.record, 'pending')
local hook = {delivery = K.delivery, tpl = A.delivery, hook_queue = K.hook_queue, queues_set = K.queues}
batch_end_if_done(K.record, K.results, A.stamp, A.channel, hook)
return 'ok'
