-- unclaim.lua: take back a claim whose attempt never acted (its answer never came, its
-- lease could not be confirmed, or the attempt said it did nothing), so that the next
-- claim runs at once with the fence this one had; and refuse a copy of the claim that is
-- still on its way (a frozen server runs the claim when it wakes, perhaps after this).
--
-- KEYS[1]  record key (layout in claim.lua)
-- KEYS[2]  lease key
-- ARGV[1]  owner token of the caller
-- ARGV[2]  how long a claim of the caller is refused, in milliseconds (the lease)
--
-- When the caller owns the record (in progress), its fence goes back by one and its lease
-- is dropped; a record the claim created (fence 1, no checkpoints) is deleted. Unless the
-- record is completed or another owner holds the lease, the lease key is left holding a
-- tombstone for ARGV[2] ms: "~OWNER~", or "~A~B~" when it already held A's. claim.lua takes
-- a tombstone for no lease, except for a claim by an owner it names, which it refuses as
-- busy. Publishes on KEYS[1]..":n" (SPUBLISH) when it drops the caller's claim.
--
-- Returns 1 when it took the caller's claim back, 2 when it did but the server refused
-- the publish (see complete.lua), 0 when the caller held no claim (nothing was taken back,
-- and a copy of it is refused, or finds the record completed), 3 when the caller held no
-- claim and another owner holds a live lease: no tombstone could be left, so the caller
-- tries again later (its claim may still arrive once that owner let go).
local v = redis.call('GET', KEYS[1])
local n = 0
if v then
  local st, f, owner, rest = string.match(v, '^1([PC])|(%d+)|([^|]*)|(.*)$')
  if not st then
    return redis.error_reply('idem: record of an unknown format at ' .. KEYS[1])
  end
  if st == 'C' then
    return 0 -- a copy of the claim that comes later finds the result: nothing to refuse
  end
  if owner == ARGV[1] then
    local fence = tonumber(f) - 1
    -- rest is FINGERPRINT|CREATED|BODY: the claim created the record when its fence was
    -- 1 and it holds no checkpoints.
    if fence == 0 and string.match(rest, '^[^|]*|%d+|$') then
      redis.call('DEL', KEYS[1])
    else
      redis.call('SET', KEYS[1], '1P|' .. fence .. '|' .. owner .. '|' .. rest, 'KEEPTTL')
    end
    n = 1
  end
end
local l = redis.call('GET', KEYS[2])
if n == 0 and l and l ~= ARGV[1] and string.byte(l, 1) ~= 126 then
  -- Another owner's live lease: no tombstone can be left beside it. The caller tries
  -- again, once that owner completed or let go.
  return 3
end
if not l or l == ARGV[1] then
  redis.call('SET', KEYS[2], '~' .. ARGV[1] .. '~', 'PX', ARGV[2])
elseif string.byte(l, 1) == 126 then -- another's tombstone: refuse both
  if not string.find(l, '~' .. ARGV[1] .. '~', 1, true) then
    l = l .. ARGV[1] .. '~'
  end
  redis.call('SET', KEYS[2], l, 'PX', ARGV[2])
end
if n == 1 and redis.REDIS_VERSION_NUM then
  -- Wake the waiters: one of them claims the key (see complete.lua).
  local r = redis.pcall('SPUBLISH', KEYS[1] .. ':n', '1')
  if type(r) == 'table' and r.err then
    return 2
  end
end
return n
