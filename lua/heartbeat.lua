-- heartbeat.lua: renew the lease, if the caller still holds it.
--
-- KEYS[1]  lease key
-- ARGV[1]  owner token of the caller
-- ARGV[2]  lease, in milliseconds
--
-- Returns 1 when the lease was renewed, 0 when it is gone or held by another owner.
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
return 0
