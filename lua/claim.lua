-- claim.lua: claim one operation for an owner, or report why not.
--
-- Record layout (one string), format 1 (redis_record.go is its Go side):
--   1S|FENCE|OWNER|FINGERPRINT|CREATED|BODY
--   1 is the format version; S is P (in progress or released) or C (completed).
--   CREATED is the Unix time, in seconds, of the record's first claim, by its caller's
--   clock (in ARGV[1]; records written before took the server's TIME). For P, BODY holds
--   the checkpoints as netstrings (LEN:NAME LEN:VALUE ...); for C, the stored
--   payload after a format byte (see complete.lua). A record of another format is
--   refused with an error, never misread.
--
-- KEYS[1]  record key
-- KEYS[2]  lease key
-- ARGV[1]  the record this claim creates on a fresh key, built by the caller:
--          1P|1|OWNER|FINGERPRINT|CREATED| with OWNER = ARGV[2], FINGERPRINT the
--          request's and CREATED the caller's clock, Unix time in whole seconds
--          (so that a fresh key needs neither TIME nor a string built here)
-- ARGV[2]  owner token of the caller
-- ARGV[3]  lease, in milliseconds
-- ARGV[4]  record TTL for an unfinished record (lease + retention), in milliseconds
-- ARGV[5]  optional: "1" when the caller waits for replicas (WAIT) behind this script:
--          a completed record is then touched with a write (its own TTL set again),
--          so that the WAIT on this connection covers it and a replay is never handed
--          out before replicas hold the record; absent, or "0" before ARGV[6], otherwise
-- ARGV[6]  optional: the request's fingerprint keyed with each other key the caller lists,
--          comma-separated (KEYID.MAC, see below); absent for a caller without a sealer
--
-- Fingerprints: a keyed one is KEYID.MAC (the key id may hold dots; MAC is base64url, which
-- has none); a plain one has no dot. A stored fingerprint equal to the request's, or to one
-- in ARGV[6], is the same request. One keyed with the key of the request's or of one in
-- ARGV[6] is another request. Anything else (a key the caller does not list, a keyed record
-- met by a plain caller, a plain record met by a keyed caller) can be neither verified nor
-- opened. ClaimRequest.MatchFingerprint is the same rule in Go: the caller applies it to a
-- completed record, which this script returns whole, whatever its fingerprint.
--
-- The lease key may hold a tombstone, "~OWNER~" (unclaim.lua): no lease, but a claim by an
-- owner it names is refused as busy (a copy of a claim taken back, reaching the server late).
--
-- Returns one of
--   1                        claimed a fresh key: fence 1, no checkpoints (the hot path of a
--                            first request: one integer to read)
--   {1, fence, checkpoints}  claimed an in-progress record (taken over, or ARGV[2] already
--                            owns it: a re-sent claim, whose lease is then renewed)
--   record                   completed: the whole record as a bare string, unparsed and its
--                            fingerprint not compared (the hot path of replays: one reply
--                            value to read, one byte looked at)
--   {3, pttl}                busy: another owner holds a live lease for pttl more milliseconds
--   {4, fence}               mismatch: an in-progress record holds another fingerprint
--   {5}                      unreadable: an in-progress record's fingerprint is keyed with a
--                            key the caller does not list
-- The paths are ordered by frequency: a fresh key, then a replay, then the rest. Each
-- argument costs the server a string (about as much as a string.match): the hot paths
-- read only the arguments they need.
local v = redis.call('GET', KEYS[1])
if not v then
  local l = redis.call('SET', KEYS[2], ARGV[2], 'NX', 'PX', ARGV[3], 'GET')
  if l then
    if string.byte(l, 1) ~= 126 or string.find(l, '~' .. ARGV[2] .. '~', 1, true) then
      return {3, math.max(redis.call('PTTL', KEYS[2]), 1)}
    end
    redis.call('SET', KEYS[2], ARGV[2], 'PX', ARGV[3]) -- over another's tombstone
  end
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[4])
  return 1
end
local b1, st = string.byte(v, 1, 2)
if b1 == 49 and st == 67 then -- '1C': completed
  if ARGV[5] == '1' then
    local ttl = redis.call('PTTL', KEYS[1])
    if ttl > 0 then
      redis.call('PEXPIRE', KEYS[1], ttl)
    end
  end
  return v
end
if b1 ~= 49 or st ~= 80 then -- '1', then 'P'
  return redis.error_reply('idem: record of an unknown format at ' .. KEYS[1])
end
-- The header only: an anchored match that stops before the body.
local f, owner, fp, created, pos = string.match(v, '^1P|(%d+)|([^|]*)|([^|]*)|(%d+)|()')
if not f then
  return redis.error_reply('idem: unreadable record at ' .. KEYS[1])
end
local mine = string.match(ARGV[1], '^1P|1|[^|]*|([^|]*)|')
if fp ~= mine then
  local kid = string.match(fp, '^(.*)%.')
  if kid == string.match(mine, '^(.*)%.') then
    return {4, tonumber(f)}
  end
  if not kid then
    return {5}
  end
  local verdict = {5}
  for other in string.gmatch(ARGV[6] or '', '[^,]+') do
    if other == fp then
      verdict = nil
      break
    elseif string.match(other, '^(.*)%.') == kid then
      verdict = {4, tonumber(f)}
      break
    end
  end
  if verdict then
    return verdict
  end
end
local cps = string.sub(v, pos)
if owner == ARGV[2] then
  -- A re-sent claim. The lease may have expired since the first run of this
  -- script; nobody took over (the record is still the caller's), so renew it.
  local l = redis.call('GET', KEYS[2])
  if l and l ~= ARGV[2] and (string.byte(l, 1) ~= 126 or string.find(l, '~' .. ARGV[2] .. '~', 1, true)) then
    return {3, math.max(redis.call('PTTL', KEYS[2]), 1)}
  end
  redis.call('SET', KEYS[2], ARGV[2], 'PX', ARGV[3])
  return {1, tonumber(f), cps}
end
-- A tombstone (see unclaim.lua) is no lease, except to the claim it refuses.
local l = redis.call('GET', KEYS[2])
if l and (string.byte(l, 1) ~= 126 or string.find(l, '~' .. ARGV[2] .. '~', 1, true)) then
  local ttl = redis.call('PTTL', KEYS[2])
  if ttl > 0 or ttl == -1 then
    if ttl == -1 then ttl = tonumber(ARGV[3]) end
    return {3, ttl}
  end
end
-- The lease is gone, or in its last millisecond (PTTL 0): its holder gave
-- it up a tenth of the lease ago by its own clock. Take over, keeping the
-- creation time and the checkpoints.
local fence = tonumber(f) + 1
redis.call('SET', KEYS[2], ARGV[2], 'PX', ARGV[3])
redis.call('SET', KEYS[1], '1P|' .. fence .. '|' .. ARGV[2] .. '|' .. mine .. '|' .. created .. '|' .. cps, 'PX', ARGV[4])
return {1, fence, cps}
