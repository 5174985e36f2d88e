-- GIVE_UP_OVERDUE: settles a job that outlived its deadline on a worker
-- that is alive but silent about it, with the `deadline_exceeded`
-- verdict: only if it is still the same run (running, on that worker,
-- started at that time). Like FINISH: result, expiry, out of the active
-- set and of the processing list. The worker's own real result, if it
-- comes within the window, replaces this verdict. Replies {'given_up'} or
-- {'changed'} (not the same run any more: nothing done).
if redis.call('HGET', job_key, 'status') ~= 'running'
  or redis.call('HGET', job_key, 'worker') ~= worker
  or redis.call('HGET', job_key, 'started_ms') ~= started_ms then
  return {'changed'}
end
local attempt = redis.call('HGET', job_key, 'attempts') or '0'
local seq, from = settle_verdict(job_key, events_key, stdin_key, id, result, now_ms, ttl, worker,
  attempt, late_window_ms)
if not seq then
  return refused(from, 'error')
end
redis.call('LREM', processing_key, 0, id)
return {'given_up'}
