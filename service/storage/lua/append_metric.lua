-- KEYS: meta, log; ARGV: L bytes, channel, model name -> {0} | {1, entry id}
if redis.call('EXISTS', KEYS[1]) == 0 then return {0} end
local seq = tonumber(redis.call('HGET', KEYS[1], 'seq'))
local puts = redis.call('HINCRBY', KEYS[1], 'puts', 1)
local id = string.format('%d-%d', seq, puts + 1)
redis.call('XADD', KEYS[2], id, 'L', ARGV[1])
redis.call('PUBLISH', ARGV[2], ARGV[3])
return {1, id}
