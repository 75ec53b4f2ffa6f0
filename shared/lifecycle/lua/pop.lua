-- pop: Up to ARGV[1] more job IDs into the intermediate list, where RQ's maintenance finds them if the
-- worker dies before the batch starts; it stops before an id starting with ARGV[2] (a bulk chunk,
-- a batch of its own). LMOVE needs Redis >= 6.2.
--
-- KEYS: queue, intermediate

local want, stop = tonumber(ARGV[1]), ARGV[2]
local out = {}
while #out < want do
  local id = redis.call('LINDEX', KEYS[1], 0)
  if not id or (stop ~= '' and string.sub(id, 1, #stop) == stop) then break end
  redis.call('LMOVE', KEYS[1], KEYS[2], 'LEFT', 'RIGHT')
  out[#out + 1] = id
end
return out
