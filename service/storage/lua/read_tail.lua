-- A script rather than MULTI: atomic on a single server and in a cluster alike (redis-py's
-- asyncio cluster client runs each command queued in a MULTI in a thread of its own with a new
-- event loop, blocking the service's loop), in one round trip.
-- KEYS: log, ckpt, meta; ARGV: min id, count, the reader's applied seq, its model's created_at
-- -> {entries as XRANGE gives them, {ckpt applied, ckpt time}, meta confirmed (or nil)}
-- Also publishes the reader's applied seq in meta (the owner's progress, read by the admission
-- control of other processes) if it moved and the model still exists as the reader's incarnation
-- (a reader of a model deleted and created again publishes nothing into the new one): an idle
-- writer's reads write nothing, so they cost no AOF write.
local was = redis.call('HGET', KEYS[3], 'applied')
if was ~= ARGV[3] and redis.call('HGET', KEYS[3], 'created_at') == ARGV[4] then
  redis.call('HSET', KEYS[3], 'applied', ARGV[3])
end
return {redis.call('XRANGE', KEYS[1], ARGV[1], '+', 'COUNT', ARGV[2]),
        redis.call('HMGET', KEYS[2], 'applied', 'time'),
        redis.call('HGET', KEYS[3], 'confirmed')}
