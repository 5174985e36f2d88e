-- SEND_INPUT: appends a control message from a stream client (stdin,
-- stdin close, a signal) for the job's worker; the variadic arguments are
-- the message's field/value pairs. Only while the job is queued or
-- running, so nothing is added to the stream of an ended job (its keys
-- expire) and no key is created for a gone one. Nothing trims the stream:
-- each message is counted instead — stdin bytes in `stdin_bytes`, signals
-- in `signals`, every message in `control_messages` — and its bytes count
-- against the API key's storage budget; a message over any budget is
-- refused whole and not counted, so signals can never crowd out a
-- `cancel` or stdin. Replies {sent, bytes used} | {over, bytes used} |
-- {signals, count} | {messages, count} | {storage, bytes the key holds} |
-- {ended, status} | {missing}.
local status = redis.call('HGET', job_key, 'status')
if not status then
  return {'missing'}
end
if status ~= 'queued' and status ~= 'running' then
  return {'ended', status}
end
local messages = tonumber(redis.call('HGET', job_key, 'control_messages') or '0')
if messages >= tonumber(max_messages) then
  return {'messages', tostring(messages)}
end
if kind == 'signal' then
  local signals = tonumber(redis.call('HGET', job_key, 'signals') or '0')
  if signals >= tonumber(max_signals) then
    return {'signals', tostring(signals)}
  end
end
local used = tonumber(redis.call('HGET', job_key, 'stdin_bytes') or '0')
local bytes = tonumber(stdin_bytes)
if bytes > 0 and used + bytes > tonumber(max_stdin_bytes) then
  return {'over', tostring(used)}
end
local cost = bytes + EVENT_OVERHEAD
local stored = redis.call('HGET', job_key, 'stored_key')
if stored then
  local held = tonumber(redis.call('HGET', stored, 'total') or '0')
  -- The key's budget as it was resolved when the job was submitted (a
  -- job submitted before it was kept: the one given).
  local budget = tonumber(redis.call('HGET', job_key, 'storage_budget') or storage_budget)
  if held + cost > budget then
    return {'storage', tostring(held)}
  end
  redis.call('HINCRBY', stored, 'total', cost)
  redis.call('HINCRBY', stored, 'j:' .. id, cost)
end
if bytes > 0 then
  used = redis.call('HINCRBY', job_key, 'stdin_bytes', bytes)
end
if kind == 'signal' then
  redis.call('HINCRBY', job_key, 'signals', 1)
end
redis.call('HINCRBY', job_key, 'control_messages', 1)
redis.call('HINCRBY', job_key, 'control_bytes', cost)
local command = {'XADD', stdin_key, '*'}
for i = REST, #ARGV do
  command[#command + 1] = ARGV[i]
end
redis.call(unpack(command))
return {'sent', tostring(used)}
