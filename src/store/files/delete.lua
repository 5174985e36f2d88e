-- DELETE: removes a file's bytes and its entry in the storage account.
-- Replies 1 if the file was there, else 0.
local existed = redis.call('DEL', file_key)
local bytes = redis.call('HGET', stored_key, member)
if bytes then
  redis.call('HDEL', stored_key, member)
  redis.call('HINCRBY', stored_key, 'total', -tonumber(bytes))
  redis.call('ZREM', expiry_key, member)
end
return existed
