-- forget.lua: delete an operation's record and lease, so that its key runs again as new;
-- refused while a live lease holds the operation, unless forced.
--
-- KEYS[1]  record key (layout in claim.lua)
-- KEYS[2]  lease key
-- ARGV[1]  "1" to delete even under a live lease
--
-- Publishes on the channel KEYS[1]..":n" (SPUBLISH) when it deletes anything, so that
-- waiters claim the key at once; a refused publish (see complete.lua) changes nothing.
--
-- Returns {n}        n keys deleted: 0 when there was nothing, 1 or 2 otherwise
--         {-1, pttl} refused: a live lease holds the operation for pttl more
--                    milliseconds (-1: a lease without a TTL, which idem never writes)
local ttl = redis.call('PTTL', KEYS[2])
if ARGV[1] ~= '1' and (ttl > 0 or ttl == -1) then
  return {-1, ttl}
end
local n = redis.call('DEL', KEYS[1], KEYS[2])
if n > 0 and redis.REDIS_VERSION_NUM then
  redis.pcall('SPUBLISH', KEYS[1] .. ':n', '1')
end
return {n}
