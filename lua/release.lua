-- release.lua: compare-and-release. Drop the caller's lease so the next claim runs
-- again; the record keeps its fence, checkpoints and TTL.
--
-- KEYS[1]  record key (layout in claim.lua)
-- KEYS[2]  lease key
-- ARGV[1]  owner token of the caller
--
-- Publishes on the channel KEYS[1]..":n" (SPUBLISH) when it drops the lease.
--
-- Returns 1 when the claim is released (also when it already was: a re-sent release),
-- 2 when it released it but the server refused the publish (see complete.lua), 0 when
-- the caller does not own the record, or it is completed or gone.
local v = redis.call('GET', KEYS[1])
if not v then
  return 0
end
local st, owner = string.match(v, '^1([PC])|%d+|([^|]*)|')
if not st then
  return redis.error_reply('idem: record of an unknown format at ' .. KEYS[1])
end
if st ~= 'P' or owner ~= ARGV[1] then
  return 0
end
if redis.call('GET', KEYS[2]) == ARGV[1] then
  redis.call('DEL', KEYS[2])
  -- Wake the waiters: one of them takes the key over (see complete.lua).
  if redis.REDIS_VERSION_NUM then
    local r = redis.pcall('SPUBLISH', KEYS[1] .. ':n', '1')
    if type(r) == 'table' and r.err then
      return 2
    end
  end
end
return 1
