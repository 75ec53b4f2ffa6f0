-- field-of-each: One field of each hash given, in their order (a popped batch's content types, read ahead of its
-- start beside one MGET of its inputs): one command for the batch where a pipeline sent an HGET per job, each
-- costing the worker's client more than Redis. Reads only. Returns per hash the field's value, or nil.
--
-- KEYS: (none fixed)
-- KEYS per item: hash
-- ARGV: field

local out = {}
for i = 1, #KEYS do out[i] = redis.call('HGET', KEYS[i], A.field) or false end
return out
