-- KEYS: meta, ckpt, buffer, log, fence
-- ARGV: trim min id, fencing token, n, then n ckpt field/value pairs, then buffer class/vector
--       pairs (the fields: service.storage.checkpoint)
-- -> 1 written | 0 no model | -1 fenced (a newer token was granted: this writer lost its lease)
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
if redis.call('GET', KEYS[5]) ~= ARGV[2] then return -1 end
local n = tonumber(ARGV[3])
redis.call('DEL', KEYS[2])
for i = 4, 3 + 2 * n, 2 do redis.call('HSET', KEYS[2], ARGV[i], ARGV[i + 1]) end
redis.call('DEL', KEYS[3])
for i = 4 + 2 * n, #ARGV, 2 do redis.call('HSET', KEYS[3], ARGV[i], ARGV[i + 1]) end
redis.call('XTRIM', KEYS[4], 'MINID', ARGV[1])
return 1
