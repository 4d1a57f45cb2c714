-- KEYS: meta, gallery; ARGV: item key -> {0} no model | {1, changes} | {2} no such item
if redis.call('EXISTS', KEYS[1]) == 0 then return {0} end
if redis.call('HDEL', KEYS[2], ARGV[1]) == 0 then return {2} end
return {1, redis.call('HINCRBY', KEYS[1], 'gallery', 1)}
