-- pop: Up to `want` more job IDs into the intermediate list, where RQ's maintenance finds them if the
-- worker dies before the batch starts; it stops before an id starting with `stop` (a bulk chunk,
-- a batch of its own; '' for none). LMOVE needs Redis >= 6.2.
--
-- KEYS: queue, intermediate
-- ARGV: want, stop

local want, stop = tonumber(A.want), A.stop
local out = {}
while #out < want do
  local id = redis.call('LINDEX', K.queue, 0)
  if not id or (stop ~= '' and string.sub(id, 1, #stop) == stop) then break end
  redis.call('LMOVE', K.queue, K.intermediate, 'LEFT', 'RIGHT')
  out[#out + 1] = id
end
return out
