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
local seq, from = settle_job(job_key, events_key, stdin_key, id, 'error', result, nil, now_ms, ttl,
  '{"type":"exit","status":"error","result":' .. result .. '}')
if not seq then
  return refused(from, 'error')
end
give_up(job_key, worker, redis.call('HGET', job_key, 'attempts') or '0', now_ms, late_window_ms, seq)
redis.call('LREM', processing_key, 0, id)
return {'given_up'}
