-- stage-chunks: A slice of an upload, staged: each chunk's info hash and RQ job hash, the chunk ids in the batch's chunks
-- list, and the result lines of refused input lines (the chunks' inputs are plain SETs beside it: a script
-- copies every argument into Lua, about 1 ms for 700 kB). Nothing is queued and no record names them yet:
-- every key expires with `ttl` unless the upload goes on to be queued. chunks: per chunk (in its keys' order) its
-- id and its two hashes' fields.
--
-- KEYS: chunks, results
-- KEYS per item: job, info
-- ARGV: ttl, refused[], chunks[id, info<>, job<>]

local ttl = A.ttl
for _, line in ipairs(A.refused) do redis.call('RPUSH', K.results, line) end
if #A.refused > 0 then redis.call('EXPIRE', K.results, ttl) end
local ids, n = {}, 0
for k = FIXED + 1, #KEYS, STRIDE do
  local job, info = KEYS[k], KEYS[k + 1]
  n = n + 1
  ids[n] = A.chunks.id[n]
  redis.call('HSET', info, unpack(A.chunks.info[n]))
  redis.call('EXPIRE', info, ttl)
  redis.call('HSET', job, unpack(A.chunks.job[n]))
  redis.call('EXPIRE', job, ttl)
end
if n > 0 then
  redis.call('RPUSH', K.chunks, unpack(ids))
  redis.call('EXPIRE', K.chunks, ttl)
end
return n
