-- checkpoint.lua: save a named value on an unfinished record, if the caller owns it.
--
-- KEYS[1]  record key (layout in claim.lua)
-- ARGV[1]  owner token of the caller
-- ARGV[2]  checkpoint name
-- ARGV[3]  checkpoint value
--
-- Returns 1 when saved (replacing an earlier value of that name), 0 when the caller
-- does not own the record or the record is completed or gone. The record keeps its TTL.
local v = redis.call('GET', KEYS[1])
if not v then
  return 0
end
local st, owner, pos = string.match(v, '^1([PC])|%d+|([^|]*)|[^|]*|%d+|()')
if not st then
  return redis.error_reply('idem: record of an unknown format at ' .. KEYS[1])
end
if st ~= 'P' or owner ~= ARGV[1] then
  return 0
end
local out = {string.sub(v, 1, pos - 1)}
local i = pos
while i <= #v do
  local c = string.find(v, ':', i, true)
  local e = c + tonumber(string.sub(v, i, c - 1))
  local name = string.sub(v, c + 1, e)
  local c2 = string.find(v, ':', e + 1, true)
  local e2 = c2 + tonumber(string.sub(v, e + 1, c2 - 1))
  if name ~= ARGV[2] then
    out[#out + 1] = string.sub(v, i, e2)
  end
  i = e2 + 1
end
out[#out + 1] = #ARGV[2] .. ':' .. ARGV[2] .. #ARGV[3] .. ':' .. ARGV[3]
redis.call('SET', KEYS[1], table.concat(out), 'KEEPTTL')
return 1
