-- claim.lua: claim one operation for an owner, or report why not.
--
-- Record layout (one string): STATE|FENCE|OWNER|FINGERPRINT|BODY
--   STATE is P (in progress or released) or C (completed). For P, BODY holds the
--   checkpoints as netstrings (LEN:NAME LEN:VALUE ...); for C, the stored payload
--   after a format byte (see complete.lua).
--
-- KEYS[1]  record key
-- KEYS[2]  lease key
-- ARGV[1]  owner token of the caller
-- ARGV[2]  request fingerprint
-- ARGV[3]  lease, in milliseconds
-- ARGV[4]  record TTL for an unfinished record (lease + retention), in milliseconds
-- ARGV[5]  "1" when the caller waits for replicas (WAIT) behind this script: a completed
--          record is then touched with a write (its own TTL set again), so that the
--          WAIT on this connection covers it and a replay is never handed out before
--          replicas hold the record
--
-- Returns one of
--   {1, fence, checkpoints}  claimed; also when ARGV[1] already owns the record (a re-sent
--                            claim), whose lease is then renewed
--   {2, record}              completed: the whole record; the caller checks its fingerprint
--                            and replays its payload (this is the hot path of replays, so
--                            the script does not parse the record)
--   {3, pttl}                busy: another owner holds a live lease for pttl more milliseconds
--   {4}                      mismatch: the record holds another fingerprint
local v = redis.call('GET', KEYS[1])
local fence, cps = 1, ''
if v then
  if string.byte(v, 1) == 67 then -- 'C'
    if ARGV[5] == '1' then
      local ttl = redis.call('PTTL', KEYS[1])
      if ttl > 0 then
        redis.call('PEXPIRE', KEYS[1], ttl)
      end
    end
    return {2, v}
  end
  local st, f, owner, fp, pos = string.match(v, '^(%u)|(%d+)|([^|]*)|([^|]*)|()')
  if not st then
    return redis.error_reply('idem: unreadable record at ' .. KEYS[1])
  end
  if fp ~= ARGV[2] then
    return {4}
  end
  cps = string.sub(v, pos)
  if owner == ARGV[1] then
    -- A re-sent claim. The lease may have expired since the first run of this
    -- script; nobody took over (the record is still the caller's), so renew it.
    local l = redis.call('GET', KEYS[2])
    if l and l ~= ARGV[1] then
      return {3, redis.call('PTTL', KEYS[2])}
    end
    redis.call('SET', KEYS[2], ARGV[1], 'PX', ARGV[3])
    return {1, tonumber(f), cps}
  end
  local ttl = redis.call('PTTL', KEYS[2])
  if ttl > 0 or ttl == -1 then
    if ttl < 0 then ttl = tonumber(ARGV[3]) end
    return {3, ttl}
  end
  -- The lease is gone, or in its last millisecond (PTTL 0): its holder gave
  -- it up a tenth of the lease ago by its own clock. Take over.
  fence = tonumber(f) + 1
  redis.call('SET', KEYS[2], ARGV[1], 'PX', ARGV[3])
elseif not redis.call('SET', KEYS[2], ARGV[1], 'NX', 'PX', ARGV[3]) then
  return {3, math.max(redis.call('PTTL', KEYS[2]), 1)}
end
redis.call('SET', KEYS[1], 'P|' .. fence .. '|' .. ARGV[1] .. '|' .. ARGV[2] .. '|' .. cps, 'PX', ARGV[4])
return {1, fence, cps}
