-- A key's storage account, shared by its jobs and its files: `stored_key`
-- (hash: the bytes of each member — `j:<job id>`, an idempotency record,
-- `f:<sha256>` — and their 'total') and `expiry_key` (sorted set: when each
-- member's bytes go). Releases the members whose time has come, at most
-- 1000 a call; whoever checks the budget calls this first.
local function sweep_storage(stored_key, expiry_key, now)
  local expired = redis.call('ZRANGEBYSCORE', expiry_key, '-inf', now, 'LIMIT', 0, 1000)
  for _, member in ipairs(expired) do
    local bytes = tonumber(redis.call('HGET', stored_key, member) or '0')
    redis.call('HDEL', stored_key, member)
    redis.call('HINCRBY', stored_key, 'total', -bytes)
    redis.call('ZREM', expiry_key, member)
  end
end

