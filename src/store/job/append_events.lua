-- APPEND_EVENTS: appends a running attempt's events; the variadic
-- arguments are pairs of (kind, payload): kind `event` with an event's
-- JSON (stages), or `stdout`/`stderr` with raw output bytes. Nothing once
-- the job is terminal, gone or another attempt's (so no event follows
-- `exit`, and a lost attempt's late output never mixes into a retry's).
-- Output beyond MAX_OUTPUT_EVENTS is left out. Counts the bytes for the
-- job's storage. Replies {'ended'} or {'ok', last seq (0 if nothing was
-- appended), output events left out}.
if redis.call('HGET', job_key, 'status') ~= 'running'
  or redis.call('HGET', job_key, 'worker') ~= worker
  or redis.call('HGET', job_key, 'attempts') ~= attempt then
  return {'ended'}
end
local seq = 0
local dropped = 0
local bytes = 0
local outputs = tonumber(redis.call('HGET', job_key, 'out_events') or '0')
for i = REST, #ARGV, 2 do
  local kind, payload = ARGV[i], ARGV[i + 1]
  if kind == 'event' then
    seq = append_event(events_key, job_key, payload)
    bytes = bytes + #payload + EVENT_OVERHEAD
  elseif outputs < MAX_OUTPUT_EVENTS then
    seq = append_entry(events_key, job_key, 't', kind, 'd', payload)
    outputs = outputs + 1
    bytes = bytes + #payload + EVENT_OVERHEAD
  else
    dropped = dropped + 1
  end
end
redis.call('HSET', job_key, 'out_events', outputs)
redis.call('HINCRBY', job_key, 'event_bytes', bytes)
return {'ok', tostring(seq), tostring(dropped)}
