-- TOUCH: a use of a file (a read, a check that it is there): renews its
-- time. Replies {'found', size, bytes or ''} or {'missing', 0, ''}.
if redis.call('HEXISTS', stored_key, member) == 0 or redis.call('EXISTS', file_key) == 0 then
  return {'missing', 0, ''}
end
redis.call('PEXPIRE', file_key, keep_ms)
redis.call('ZADD', expiry_key, now + keep_ms, member)
local size = redis.call('STRLEN', file_key)
if want_bytes == 1 then
  return {'found', size, redis.call('GET', file_key)}
end
return {'found', size, ''}
