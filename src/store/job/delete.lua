-- DELETE: removes an ended job before its keys expire (Judge0's `DELETE
-- /submissions/{token}`): its hash, events, control stream, compatible
-- API record, run-history summary and entries, and its bytes from its
-- key's storage account. No status moves, and only an ended job goes: a
-- queued or running one is left as it is. The usage ledger keeps what
-- the job used (it was used).
-- Replies {'deleted'} | {'missing'} | {'active', status}.
local status = redis.call('HGET', job_key, 'status')
if not status then
  return {'missing'}
end
if not TERMINAL[status] then
  return {'active', status}
end
local stored = redis.call('HGET', job_key, 'stored_key')
if stored then
  local member = 'j:' .. id
  local bytes = tonumber(redis.call('HGET', stored, member) or '0')
  if redis.call('HDEL', stored, member) == 1 then
    redis.call('HINCRBY', stored, 'total', -bytes)
  end
  local expiry = redis.call('HGET', job_key, 'expiry_key')
  if expiry then
    redis.call('ZREM', expiry, member)
  end
end
local summary = redis.call('HGET', job_key, 'summary_key')
if summary then
  redis.call('DEL', summary)
end
redis.call('ZREM', history_key, id)
if user_history_key ~= history_key then
  redis.call('ZREM', user_history_key, id)
end
redis.call('DEL', job_key, events_key, stdin_key, compat_key)
return {'deleted'}
