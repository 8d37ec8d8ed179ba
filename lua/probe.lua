-- probe.lua: RedisStore.Check's probe of what the store's scripts need: the commands they
-- call, on a key under the prefix, and the publish on its channel. It leaves nothing behind
-- (the key it writes is deleted, or expires within 10 seconds when DEL is refused).
--
-- KEYS[1]  a probe key under the prefix, "<prefix>:{idem-check…}"
-- ARGV[1]  a value to write
--
-- Returns {}                 everything was allowed
--         {command, error}   the first command the server refused, with its error
local function refused(...)
  local r = redis.pcall(...)
  if type(r) == 'table' and r.err then
    return r.err
  end
end
local ttl = 10000
local calls = {
  {'SET', KEYS[1], ARGV[1], 'PX', ttl},
  {'GET', KEYS[1]},
  {'PTTL', KEYS[1]},
  {'PEXPIRE', KEYS[1], ttl},
  {'DEL', KEYS[1]},
}
for _, c in ipairs(calls) do
  local err = refused(unpack(c))
  if err then
    redis.pcall('DEL', KEYS[1])
    return {c[1], err}
  end
end
if redis.REDIS_VERSION_NUM then
  local err = refused('SPUBLISH', KEYS[1] .. ':n', '')
  if err then
    return {'SPUBLISH', err}
  end
end
return {}
