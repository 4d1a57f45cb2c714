-- KEYS: members; ARGV: member id, info JSON, ttl ms -> flat list of the live members' id, info
-- (our heartbeat, and expired members removed, with the server's clock: no skew between hosts)
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('HSET', KEYS[1], ARGV[1], string.format('%d %s', now + tonumber(ARGV[3]), ARGV[2]))
local all = redis.call('HGETALL', KEYS[1])
local out = {}
for i = 1, #all, 2 do
  local expiry, info = string.match(all[i + 1], '^(%d+) (.*)$')
  if tonumber(expiry) < now then
    redis.call('HDEL', KEYS[1], all[i])
  else
    out[#out + 1] = all[i]
    out[#out + 1] = info
  end
end
return out
