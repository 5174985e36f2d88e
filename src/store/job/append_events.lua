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
local seq, dropped = append_batch(events_key, job_key, REST)
return {'ok', tostring(seq), tostring(dropped)}
