-- call_many: one call for many arguments (prepended to the scripts that use it).

-- One call for many arguments (a batch's registry entries, its deleted keys), in slices unpack takes.
local function call_many(cmd, key, args)
  for i = 1, #args, 1000 do
    local last = math.min(i + 999, #args)
    if key then redis.call(cmd, key, unpack(args, i, last)) else redis.call(cmd, unpack(args, i, last)) end
  end
end
