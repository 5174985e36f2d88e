-- DELETE: removes a file's metadata and its entry in the storage account,
-- and makes its object due for the garbage collection. Replies the
-- object's name, or '' when the key had no such file.
local object = redis.call('GET', meta_key)
redis.call('DEL', meta_key)
local bytes = redis.call('HGET', stored_key, member)
if bytes then
  redis.call('HDEL', stored_key, member)
  redis.call('HINCRBY', stored_key, 'total', -tonumber(bytes))
  redis.call('ZREM', expiry_key, member)
end
if object then
  redis.call('ZADD', objects_key, 0, object)
  return object
end
return ''
