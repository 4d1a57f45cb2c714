-- KEYS: meta; ARGV: seq, part of a log id confirmed by replicas, channel, model name
-- -> 0 no model | 1 (publishes the name when the watermark rose: the owner reads that far now)
-- Raises the model's ``confirmed`` watermark to that id (never lowers it: appends confirmed out of
-- order by several processes each cover every entry logged before them).
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
local s, k = tonumber(ARGV[1]), tonumber(ARGV[2])
local cur = redis.call('HGET', KEYS[1], 'confirmed')
if cur then
  local cs, ck = string.match(cur, '^(%d+)-(%d+)$')
  cs, ck = tonumber(cs), tonumber(ck)
  if cs > s or (cs == s and ck >= k) then return 1 end
end
redis.call('HSET', KEYS[1], 'confirmed', string.format('%d-%d', s, k))
redis.call('PUBLISH', ARGV[3], ARGV[4])
return 1
