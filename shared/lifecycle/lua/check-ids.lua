-- check-ids: A slice of an upload's custom ids: each one's first line, kept in a hash while the upload runs (an upload is
-- read a slice at a time, so repeats are found here, not in the API's memory). KEYS: the ids hash.
-- ARGV: its ttl, then per id: the id and its line. Returns per id 0 (first seen) or the line that held it first.
--
-- KEYS: ids

local out = {}
for i = 2, #ARGV, 2 do
  if redis.call('HSETNX', KEYS[1], ARGV[i], ARGV[i + 1]) == 1 then
    out[#out + 1] = 0
  else
    out[#out + 1] = tonumber(redis.call('HGET', KEYS[1], ARGV[i])) or 0
  end
end
redis.call('EXPIRE', KEYS[1], ARGV[1])
return out
