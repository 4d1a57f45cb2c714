-- KEYS: ckpt, buffer -> {ckpt field, value, ...}, {buffer class, vector, ...}
return {redis.call('HGETALL', KEYS[1]), redis.call('HGETALL', KEYS[2])}
