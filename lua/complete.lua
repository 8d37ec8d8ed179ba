-- complete.lua: compare-and-complete. Store the payload and mark the record completed,
-- only if the caller still owns it; then drop the caller's lease.
--
-- KEYS[1]  record key (layout in claim.lua)
-- KEYS[2]  lease key
-- ARGV[1]  owner token of the caller
-- ARGV[2]  payload to store
-- ARGV[3]  retention, in milliseconds
-- ARGV[4]  payload format: one byte, stored before the payload (= raw, z deflate)
--
-- Publishes on the channel KEYS[1]..":n" (SPUBLISH) when it completes the record.
--
-- Returns 1 when the record is completed by the caller (also when it already was: a
-- re-sent complete), 2 when it completed it but the server refused the publish (an ACL
-- user without the channel), 0 when the caller does not own the record or it is gone.
local v = redis.call('GET', KEYS[1])
if not v then
  return 0
end
-- One match for the state, the header to keep and, nested in it, the owner.
local st, head, owner = string.match(v, '^1([PC])(|%d+|([^|]*)|[^|]*|%d+|)')
if not st then
  return redis.error_reply('idem: record of an unknown format at ' .. KEYS[1])
end
if owner ~= ARGV[1] then
  return 0
end
if st == 'C' then
  return 1
end
redis.call('SET', KEYS[1], '1C' .. head .. ARGV[4] .. ARGV[2], 'PX', ARGV[3])
-- Only a claim writes the lease, together with the record's owner: a lease
-- that exists while the caller owns the record is the caller's.
redis.call('DEL', KEYS[2])
-- Wake the waiters (sharded Pub/Sub, on the record's shard). SPUBLISH came
-- with Redis 7.0, as REDIS_VERSION_NUM did: a server that sets it has SPUBLISH,
-- and one without it (an embedded test server) has no subscribers either. A
-- refused publish must not undo the completion in the caller's eyes: it is
-- reported, and waiters poll.
if redis.REDIS_VERSION_NUM then
  local r = redis.pcall('SPUBLISH', KEYS[1] .. ':n', '1')
  if type(r) == 'table' and r.err then
    return 2
  end
end
return 1
