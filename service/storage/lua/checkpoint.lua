-- KEYS: meta, ckpt, buffer, log, fence
-- ARGV: trim min id, fencing token, the log position it covers ("<ms>-<part>"), the model's
--       created_at stamp, n, then n ckpt field/value pairs, then buffer class/vector pairs (the
--       fields: service.storage.checkpoint)
-- -> 1 written | 0 no model (or another incarnation of it: deleted and created again, its fence
--    counting from 1 again) | -1 fenced (a newer token was granted: this writer lost its lease)
--    | -2 behind (the stored checkpoint covers a later position: written by a newer owner, and
--    the log before it may be trimmed, so this older state must not replace it)
if redis.call('HGET', KEYS[1], 'created_at') ~= ARGV[4] then return 0 end
if redis.call('GET', KEYS[5]) ~= ARGV[2] then return -1 end
local stored = redis.call('HGET', KEYS[2], 'applied')
if stored then
  local sms, spart = string.match(stored, '^(%d+)-(%d+)$')
  local nms, npart = string.match(ARGV[3], '^(%d+)-(%d+)$')
  sms, spart, nms, npart = tonumber(sms), tonumber(spart), tonumber(nms), tonumber(npart)
  if sms > nms or (sms == nms and spart > npart) then return -2 end
end
local n = tonumber(ARGV[5])
redis.call('DEL', KEYS[2])
for i = 6, 5 + 2 * n, 2 do redis.call('HSET', KEYS[2], ARGV[i], ARGV[i + 1]) end
redis.call('DEL', KEYS[3])
for i = 6 + 2 * n, #ARGV, 2 do redis.call('HSET', KEYS[3], ARGV[i], ARGV[i + 1]) end
redis.call('XTRIM', KEYS[4], 'MINID', ARGV[1])
return 1
