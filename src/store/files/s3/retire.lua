-- RETIRE: takes a due object out of the objects' set before its bytes are
-- deleted. Replies 1 when it was due (if its file still names it, in the
-- millisecond its time runs out, the file goes too), else 0: renewed by a
-- use since, or taken by another process.
local score = redis.call('ZSCORE', objects_key, object)
if not score or tonumber(score) > now then
  return 0
end
if redis.call('GET', meta_key) == object then
  redis.call('DEL', meta_key)
  local bytes = redis.call('HGET', stored_key, member)
  if bytes then
    redis.call('HDEL', stored_key, member)
    redis.call('HINCRBY', stored_key, 'total', -tonumber(bytes))
    redis.call('ZREM', expiry_key, member)
  end
end
redis.call('ZREM', objects_key, object)
return 1
