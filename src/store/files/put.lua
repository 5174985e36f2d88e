-- PUT: keeps a file's bytes under its key and digest, counted in the key's
-- storage account until it has gone unused for `keep_ms`. Replies
-- {'created'}, {'existed'} (its time renewed) or {'over_budget', held}.
sweep_storage(stored_key, expiry_key, now)
if redis.call('EXISTS', file_key) == 1 and redis.call('HEXISTS', stored_key, member) == 1 then
  redis.call('PEXPIRE', file_key, keep_ms)
  redis.call('ZADD', expiry_key, now + keep_ms, member)
  return {'existed'}
end
-- Half of a file (its bytes expired before the sweep reached its account
-- entry): let go of what is left before it is kept again.
local old = redis.call('HGET', stored_key, member)
if old then
  redis.call('HDEL', stored_key, member)
  redis.call('HINCRBY', stored_key, 'total', -tonumber(old))
end
local held = tonumber(redis.call('HGET', stored_key, 'total') or '0')
local size = string.len(content)
if held + size > budget then
  return {'over_budget', tostring(held)}
end
redis.call('SET', file_key, content, 'PX', keep_ms)
redis.call('HSET', stored_key, member, size)
redis.call('HINCRBY', stored_key, 'total', size)
redis.call('ZADD', expiry_key, now + keep_ms, member)
return {'created'}
