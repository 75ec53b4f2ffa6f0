-- stage-chunks: A slice of an upload, staged: each chunk's info hash and RQ job hash, the chunk ids in the batch's chunks
-- list, and the result lines of refused input lines (the chunks' inputs are plain SETs beside it: a script
-- copies every argument into Lua, about 1 ms for 700 kB). Nothing is queued and no record names them yet:
-- every key expires with ARGV[1] unless the upload goes on to be queued.
-- KEYS: chunks list, results list; per chunk: job, info.
-- ARGV: ttl, refused line count, the refused lines, then per chunk: id, info field count, info pairs, job field
-- count, job pairs.
--
-- KEYS: chunks, results
-- KEYS per item: job, info

local ttl = ARGV[1]
local refused = tonumber(ARGV[2])
for i = 3, 2 + refused do redis.call('RPUSH', KEYS[2], ARGV[i]) end
if refused > 0 then redis.call('EXPIRE', KEYS[2], ttl) end
local at = 3 + refused
local function pairs_at(i)
  local n = tonumber(ARGV[i])
  return {unpack(ARGV, i + 1, i + 2 * n)}, i + 1 + 2 * n
end
local ids = {}
for k = FIXED + 1, #KEYS, STRIDE do
  local job, info = KEYS[k], KEYS[k + 1]
  ids[#ids + 1] = ARGV[at]
  local fields
  fields, at = pairs_at(at + 1)
  redis.call('HSET', info, unpack(fields))
  redis.call('EXPIRE', info, ttl)
  fields, at = pairs_at(at)
  redis.call('HSET', job, unpack(fields))
  redis.call('EXPIRE', job, ttl)
end
if #ids > 0 then
  redis.call('RPUSH', KEYS[1], unpack(ids))
  redis.call('EXPIRE', KEYS[1], ttl)
end
return #ids
