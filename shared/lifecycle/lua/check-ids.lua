-- check-ids: A slice of an upload's custom ids: each one's first line, kept in a hash while the upload runs (an upload is
-- read a slice at a time, so repeats are found here, not in the API's memory). ids: per id the id and its line.
-- Returns per id 0 (first seen) or the line that held it first.
--
-- KEYS: ids
-- ARGV: ttl, ids[id, line]

local out = {}
for i, id in ipairs(A.ids.id) do
  if redis.call('HSETNX', K.ids, id, A.ids.line[i]) == 1 then
    out[i] = 0
  else
    out[i] = tonumber(redis.call('HGET', K.ids, id)) or 0
  end
end
redis.call('EXPIRE', K.ids, A.ttl)
return out
