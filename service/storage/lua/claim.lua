-- KEYS: lease, fence, meta; ARGV: owner id, ttl ms, created_at, held token ('' = none)
-- (member ids are the processes' advertised URLs: no two live processes share one)
-- -> {0} no such model (or another incarnation) | {1, token} held by us | {2, token} by another
if redis.call('HGET', KEYS[3], 'created_at') ~= ARGV[3] then return {0} end
local cur = redis.call('GET', KEYS[1])
if cur then
  if ARGV[4] ~= '' and cur == ARGV[4] .. ' ' .. ARGV[1] then
    redis.call('PEXPIRE', KEYS[1], ARGV[2])
    return {1, tonumber(ARGV[4])}
  end
  local token, holder = string.match(cur, '^(%d+) (.*)$')
  if ARGV[4] ~= '' or holder ~= ARGV[1] then return {2, tonumber(token)} end
  -- held under our own member id but not by us: a previous incarnation of this process (one
  -- address), which is dead: taken anew, with a new fencing token
end
local token = redis.call('INCR', KEYS[2])
redis.call('SET', KEYS[1], token .. ' ' .. ARGV[1], 'PX', ARGV[2])
return {1, token}
