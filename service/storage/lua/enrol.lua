-- KEYS: meta, gallery, idem, idem-exp
-- ARGV: now_ms, ttl_ms, max_items, idem field ('' = none), fingerprint, the cap on idempotency
--       records (0: none), then item key / value pairs (distinct keys; a key already enrolled
--       is replaced)
-- -> {0} no model | {1, changes, added, size, dropped} | {2, "fingerprint added size"} replay |
--    {3, size} the gallery would exceed max_items (nothing written); dropped: the idempotency records the cap removed (as in append.lua)
if redis.call('EXISTS', KEYS[1]) == 0 then return {0} end
local now = tonumber(ARGV[1])
-- Purge up to 64 expired idempotency records (as append.lua does).
local expired = redis.call('ZRANGEBYSCORE', KEYS[4], '-inf', now, 'LIMIT', 0, 64)
if #expired > 0 then
  redis.call('HDEL', KEYS[3], unpack(expired))
  redis.call('ZREM', KEYS[4], unpack(expired))
end

local field = ARGV[4]
if field ~= '' then
  local prev = redis.call('HGET', KEYS[3], field)
  if prev then return {2, prev} end
end
local new_items = 0
for i = 7, #ARGV, 2 do
  if redis.call('HEXISTS', KEYS[2], ARGV[i]) == 0 then new_items = new_items + 1 end
end
local size = redis.call('HLEN', KEYS[2])
if size + new_items > tonumber(ARGV[3]) then return {3, size} end
for i = 7, #ARGV, 2 do redis.call('HSET', KEYS[2], ARGV[i], ARGV[i + 1]) end
local changes = redis.call('HINCRBY', KEYS[1], 'gallery', 1)
size = size + new_items
local cap, added = tonumber(ARGV[6]), 0
if field ~= '' then
  redis.call('HSET', KEYS[3], field, string.format('%s %d %d', ARGV[5], new_items, size))
  redis.call('ZADD', KEYS[4], now + tonumber(ARGV[2]), field)
  added = 1
end

-- Keep at most ``cap`` idempotency records (as append.lua does).
local dropped = 0
if added > 0 and cap > 0 then
  local over = redis.call('ZCARD', KEYS[4]) - cap
  if over > added + 64 then over = added + 64 end
  while over > 0 do
    local k = math.min(over, 1000)
    local oldest = redis.call('ZRANGE', KEYS[4], 0, k - 1)
    redis.call('HDEL', KEYS[3], unpack(oldest))
    redis.call('ZREMRANGEBYRANK', KEYS[4], 0, k - 1)
    over = over - k
    dropped = dropped + k
  end
end

return {1, changes, new_items, size, dropped}
