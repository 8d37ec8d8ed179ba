-- claim.lua: claim one operation for an owner, or report why not.
--
-- Record layout (one string), format 1 (redis_record.go is its Go side):
--   1S|FENCE|OWNER|FINGERPRINT|CREATED|BODY
--   1 is the format version; S is P (in progress or released) or C (completed).
--   CREATED is the Unix time, in seconds, of the record's first claim. For P, BODY
--   holds the checkpoints as netstrings (LEN:NAME LEN:VALUE ...); for C, the stored
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
-- ARGV[6]  optional: the request's fingerprint keyed with each other key the caller lists,
--          comma-separated (KEYID.MAC, see below); absent for a caller without a sealer
--
-- Fingerprints: a keyed one is KEYID.MAC (the key id may hold dots; MAC is base64url, which
-- has none); a plain one has no dot. A stored fingerprint equal to ARGV[2], or to one in
-- ARGV[6], is the same request. One keyed with the key of ARGV[2] or of one in ARGV[6] is
-- another request. Anything else (a key the caller does not list, a keyed record met by a
-- plain caller, a plain record met by a keyed caller) can be neither verified nor opened.
-- ClaimRequest.MatchFingerprint is the same rule in Go.
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
local v = redis.call('GET', KEYS[1])
local fence, cps, created = 1, '', nil
if v then
  local head = string.sub(v, 1, 2)
  if head ~= '1C' and head ~= '1P' then
    return redis.error_reply('idem: record of an unknown format at ' .. KEYS[1])
  end
  -- The header only: an anchored match that stops before the body.
  local f, owner, fp, c, pos = string.match(v, '^1.|(%d+)|([^|]*)|([^|]*)|(%d+)|()')
  if not f then
    return redis.error_reply('idem: unreadable record at ' .. KEYS[1])
  end
  if fp ~= ARGV[2] then
    local kid = string.match(fp, '^(.*)%.')
    if kid == string.match(ARGV[2], '^(.*)%.') then
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
  if head == '1C' then
    if ARGV[5] == '1' then
      local ttl = redis.call('PTTL', KEYS[1])
      if ttl > 0 then
        redis.call('PEXPIRE', KEYS[1], ttl)
      end
    end
    return v
  end
  created = c
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
if not created then
  created = redis.call('TIME')[1]
end
redis.call('SET', KEYS[1], '1P|' .. fence .. '|' .. ARGV[1] .. '|' .. ARGV[2] .. '|' .. created .. '|' .. cps, 'PX', ARGV[4])
return {1, fence, cps}
