-- pop: Up to `want` more job IDs into the intermediate list, where RQ's maintenance finds them if the
-- worker dies before the batch starts; it stops before an id starting with `stop` (a bulk chunk,
-- a batch of its own; '' for none). A queue in fair order (lib/fair.lua) forgets their tags and takes as many of
-- its backlog into its list (at most `window` long). LMOVE needs Redis >= 6.2.
--
-- KEYS: queue, intermediate, fair_tags, fair_backlog
-- ARGV: want, stop, window
-- uses: fair

local want, stop, window = tonumber(A.want), A.stop, tonumber(A.window)
local out = {}
while #out < want do
  local id = redis.call('LINDEX', K.queue, 0)
  if not id and fair_refill(K.queue, K.fair_tags, K.fair_backlog, window, want - #out) > 0 then
    id = redis.call('LINDEX', K.queue, 0)
  end
  if not id or (stop ~= '' and string.sub(id, 1, #stop) == stop) then break end
  redis.call('LMOVE', K.queue, K.intermediate, 'LEFT', 'RIGHT')
  redis.call('ZREM', K.fair_tags, id)
  out[#out + 1] = id
end
fair_refill(K.queue, K.fair_tags, K.fair_backlog, window, #out)
return out
