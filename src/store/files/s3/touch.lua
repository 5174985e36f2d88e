-- TOUCH: a use of a file (a read, a check that it is there): renews its
-- time, and its object's. Replies {'found', size, object} or
-- {'missing', 0, ''}.
if redis.call('HEXISTS', stored_key, member) == 0 or redis.call('EXISTS', meta_key) == 0 then
  return {'missing', 0, ''}
end
local object = redis.call('GET', meta_key)
redis.call('PEXPIRE', meta_key, keep_ms)
redis.call('ZADD', expiry_key, now + keep_ms, member)
redis.call('ZADD', objects_key, now + keep_ms, object)
return {'found', tonumber(redis.call('HGET', stored_key, member)), object}
