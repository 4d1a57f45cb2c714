-- KEYS: meta; ARGV: config JSON, created_at -> 1 created | 0 the model exists
-- (a model exists if and only if its meta hash does)
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
redis.call('HSET', KEYS[1], 'config', ARGV[1], 'seq', 0, 'puts', 0, 'created_at', ARGV[2])
return 1
