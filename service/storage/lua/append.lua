-- KEYS: meta, log, classes, idem, idem-exp
-- ARGV: now_ms, ttl_ms, max_classes, groups, channel, model name (published on the channel
--       when anything was appended), the cap on idempotency records (0: none), then per group:
--       idem field ('' = none), fingerprint, n, x block, labels (JSON array), holdout flags
--       ('' = none), k, then its k distinct labels. Groups are appended in order, each exactly
--       as if alone (a group commit: one script, one AOF write and fsync for requests/frames
--       that arrived together), each as ONE log entry ``<last seq>-1`` holding its n samples
--       (see service.storage.codec).
-- -> {0} no model | {1, puts, dropped, r1, r2, ...}, per group r = {1, first, last} | {2, "first
--    last fingerprint"} replay | {3, classes} would exceed the class limit (that group alone:
--    nothing of it logged); puts: the metric replacements logged so far (all of them before
--    these groups); dropped: the idempotency records the cap removed (see below)
if redis.call('EXISTS', KEYS[1]) == 0 then return {0} end
local now = tonumber(ARGV[1])
-- Purge up to 64 expired idempotency records.
local expired = redis.call('ZRANGEBYSCORE', KEYS[5], '-inf', now, 'LIMIT', 0, 64)
if #expired > 0 then
  redis.call('HDEL', KEYS[4], unpack(expired))
  redis.call('ZREM', KEYS[5], unpack(expired))
end

local ttl = tonumber(ARGV[2])
local max_classes = tonumber(ARGV[3])
local cap = tonumber(ARGV[7])
local added = 0
local seq = tonumber(redis.call('HGET', KEYS[1], 'seq'))
local first_seq = seq
local out = {1, tonumber(redis.call('HGET', KEYS[1], 'puts') or '0'), 0}
local p = 8
for g = 1, tonumber(ARGV[4]) do
  local field, fp, n = ARGV[p], ARGV[p + 1], tonumber(ARGV[p + 2])
  local x, y, h, k = ARGV[p + 3], ARGV[p + 4], ARGV[p + 5], tonumber(ARGV[p + 6])
  local base = p + 6  -- distinct label i = ARGV[base + i]
  p = base + k + 1
  local prev = false
  if field ~= '' then prev = redis.call('HGET', KEYS[4], field) end
  if prev then
    out[#out + 1] = {2, prev}
  else
    local fresh = {}
    for i = 1, k do
      if redis.call('SISMEMBER', KEYS[3], ARGV[base + i]) == 0 then
        fresh[#fresh + 1] = ARGV[base + i]
      end
    end
    local have = 0
    if #fresh > 0 then have = redis.call('SCARD', KEYS[3]) end
    if #fresh > 0 and have + #fresh > max_classes then
      out[#out + 1] = {3, have}
    else
      local first = seq + 1
      seq = seq + n
      local id = string.format('%d-1', seq)
      if h == '' then
        redis.call('XADD', KEYS[2], id, 'n', n, 'x', x, 'y', y)
      else
        redis.call('XADD', KEYS[2], id, 'n', n, 'x', x, 'y', y, 'h', h)
      end
      for i = 1, #fresh do redis.call('SADD', KEYS[3], fresh[i]) end
      if field ~= '' then
        redis.call('HSET', KEYS[4], field, string.format('%d %d %s', first, seq, fp))
        redis.call('ZADD', KEYS[5], now + ttl, field)
        added = added + 1
      end
      out[#out + 1] = {1, first, seq}
    end
  end
end

-- Keep at most ``cap`` idempotency records after writing ``added``: past it, those closest to
-- expiry go first; at most ``added + 64`` per call (in chunks: ``unpack`` has a limit), so no
-- call does unbounded work.
local dropped = 0
if added > 0 and cap > 0 then
  local over = redis.call('ZCARD', KEYS[5]) - cap
  if over > added + 64 then over = added + 64 end
  while over > 0 do
    local k = math.min(over, 1000)
    local oldest = redis.call('ZRANGE', KEYS[5], 0, k - 1)
    redis.call('HDEL', KEYS[4], unpack(oldest))
    redis.call('ZREMRANGEBYRANK', KEYS[5], 0, k - 1)
    over = over - k
    dropped = dropped + k
  end
end

out[3] = dropped
redis.call('HSET', KEYS[1], 'seq', seq)
if seq > first_seq then redis.call('PUBLISH', ARGV[5], ARGV[6]) end
return out
