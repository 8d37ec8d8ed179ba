-- claim.lua: claim one operation for an owner, or report why not.
--
-- Record layout (one string), format 1 (redis_record.go is its Go side):
--   1S|FENCE|OWNER|FINGERPRINT|CREATED|BODY
--   1 is the format version; S is P (in progress or released) or C (completed).
--   CREATED is the Unix time, in seconds, of the record's first claim, by its caller's
--   clock (ARGV[6]; records written before took the server's TIME). For P, BODY holds
--   the checkpoints as netstrings (LEN:NAME LEN:VALUE ...); for C, the stored
--   payload after a format byte (see complete.lua). A record of another format is
--   refused with an error, never misread.
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
-- ARGV[6]  the caller's clock, Unix time in whole seconds (decimal): CREATED of a record
--          this claim creates (from the caller, so that a fresh key needs no TIME call)
-- ARGV[7]  optional: the request's fingerprint keyed with each other key the caller lists,
--          comma-separated (KEYID.MAC, see below); absent for a caller without a sealer
--
-- Fingerprints: a keyed one is KEYID.MAC (the key id may hold dots; MAC is base64url, which
-- has none); a plain one has no dot. A stored fingerprint equal to ARGV[2], or to one in
-- ARGV[7], is the same request. One keyed with the key of ARGV[2] or of one in ARGV[7] is
-- another request. Anything else (a key the caller does not list, a keyed record met by a
-- plain caller, a plain record met by a keyed caller) can be neither verified nor opened.
-- ClaimRequest.MatchFingerprint is the same rule in Go.
--
-- The lease key may hold a tombstone, "~OWNER~" (unclaim.lua): no lease, but a claim by an
-- owner it names is refused as busy (a copy of a claim taken back, reaching the server late).
--
-- Returns one of
--   {1, fence, checkpoints}  claimed; also when ARGV[1] already owns the record (a re-sent
--                            claim), whose lease is then renewed
--   record                   completed, same fingerprint: the whole record as a bare string,
--                            unparsed (the hot path of replays: one reply value to read)
--   {3, pttl}                busy: another owner holds a live lease for pttl more milliseconds
--   {4, fence}               mismatch: the record holds another fingerprint (decided here
--                            only, for every state)
--   {5}                      unreadable: the record's fingerprint is keyed with a key the
--                            caller does not list
-- The paths are ordered by frequency: a fresh key, then a replay, then the rest.
local v = redis.call('GET', KEYS[1])
if not v then
  local l = redis.call('SET', KEYS[2], ARGV[1], 'NX', 'PX', ARGV[3], 'GET')
  if l then
    if string.byte(l, 1) ~= 126 or string.find(l, '~' .. ARGV[1] .. '~', 1, true) then
      return {3, math.max(redis.call('PTTL', KEYS[2]), 1)}
    end
    redis.call('SET', KEYS[2], ARGV[1], 'PX', ARGV[3]) -- over another's tombstone
  end
  redis.call('SET', KEYS[1], '1P|1|' .. ARGV[1] .. '|' .. ARGV[2] .. '|' .. ARGV[6] .. '|', 'PX', ARGV[4])
  return {1, 1, ''}
end
local b1, st = string.byte(v, 1, 2)
if b1 ~= 49 or (st ~= 67 and st ~= 80) then -- '1', then 'C' or 'P'
  return redis.error_reply('idem: record of an unknown format at ' .. KEYS[1])
end
-- The header only: anchored matches that stop before the body. A completed
-- record needs its fingerprint only, unless it is another request's.
local f, owner, fp, created, pos
if st == 67 then
  fp = string.match(v, '^1C|%d+|[^|]*|([^|]*)|%d+|')
else
  f, owner, fp, created, pos = string.match(v, '^1P|(%d+)|([^|]*)|([^|]*)|(%d+)|()')
end
if not fp then
  return redis.error_reply('idem: unreadable record at ' .. KEYS[1])
end
if fp ~= ARGV[2] then
  f = tonumber(f or string.match(v, '^1C|(%d+)|'))
  local kid = string.match(fp, '^(.*)%.')
  if kid == string.match(ARGV[2], '^(.*)%.') then
    return {4, f}
  end
  if not kid then
    return {5}
  end
  local verdict = {5}
  for other in string.gmatch(ARGV[7] or '', '[^,]+') do
    if other == fp then
      verdict = nil
      break
    elseif string.match(other, '^(.*)%.') == kid then
      verdict = {4, f}
      break
    end
  end
  if verdict then
    return verdict
  end
end
if st == 67 then
  if ARGV[5] == '1' then
    local ttl = redis.call('PTTL', KEYS[1])
    if ttl > 0 then
      redis.call('PEXPIRE', KEYS[1], ttl)
    end
  end
  return v
end
local cps = string.sub(v, pos)
if owner == ARGV[1] then
  -- A re-sent claim. The lease may have expired since the first run of this
  -- script; nobody took over (the record is still the caller's), so renew it.
  local l = redis.call('GET', KEYS[2])
  if l and l ~= ARGV[1] and (string.byte(l, 1) ~= 126 or string.find(l, '~' .. ARGV[1] .. '~', 1, true)) then
    return {3, math.max(redis.call('PTTL', KEYS[2]), 1)}
  end
  redis.call('SET', KEYS[2], ARGV[1], 'PX', ARGV[3])
  return {1, tonumber(f), cps}
end
-- A tombstone (see unclaim.lua) is no lease, except to the claim it refuses.
local l = redis.call('GET', KEYS[2])
if l and (string.byte(l, 1) ~= 126 or string.find(l, '~' .. ARGV[1] .. '~', 1, true)) then
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
redis.call('SET', KEYS[2], ARGV[1], 'PX', ARGV[3])
redis.call('SET', KEYS[1], '1P|' .. fence .. '|' .. ARGV[1] .. '|' .. ARGV[2] .. '|' .. created .. '|' .. cps, 'PX', ARGV[4])
return {1, fence, cps}
