-- COMMIT: the object `object` holds the file's bytes now; the file is
-- kept if the budget allows. Replies {'created'}, {'existed'} (another
-- put of the same file came first: its object stays, this one goes),
-- {'over_budget', held} (this object goes) or {'lost'} (the upload took
-- longer than its grace and its object was deleted: nothing is kept).
-- An object that goes is made due in the objects' set, where the
-- garbage collection finds it.
sweep_storage(stored_key, expiry_key, now)
if not redis.call('ZSCORE', objects_key, object) then
  return {'lost'}
end
if redis.call('EXISTS', meta_key) == 1 and redis.call('HEXISTS', stored_key, member) == 1 then
  redis.call('PEXPIRE', meta_key, keep_ms)
  redis.call('ZADD', expiry_key, now + keep_ms, member)
  redis.call('ZADD', objects_key, now + keep_ms, redis.call('GET', meta_key))
  redis.call('ZADD', objects_key, 0, object)
  return {'existed'}
end
-- Half of a file (swept from the account, or its metadata expired): let
-- go of what is left before it is kept again.
local old = redis.call('HGET', stored_key, member)
if old then
  redis.call('HDEL', stored_key, member)
  redis.call('HINCRBY', stored_key, 'total', -tonumber(old))
end
local previous = redis.call('GET', meta_key)
if previous then
  redis.call('ZADD', objects_key, 0, previous)
end
local held = tonumber(redis.call('HGET', stored_key, 'total') or '0')
if held + size > budget then
  redis.call('DEL', meta_key)
  redis.call('ZADD', objects_key, 0, object)
  return {'over_budget', tostring(held)}
end
redis.call('SET', meta_key, object, 'PX', keep_ms)
redis.call('HSET', stored_key, member, size)
redis.call('HINCRBY', stored_key, 'total', size)
redis.call('ZADD', expiry_key, now + keep_ms, member)
redis.call('ZADD', objects_key, now + keep_ms, object)
return {'created'}
