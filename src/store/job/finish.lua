-- FINISH: records the result of `worker`'s `attempt`; the four outputs
-- (compile stdout, compile stderr, run stdout, run stderr; raw bytes) are
-- the first variadic arguments, the attempt's last events (pairs, as
-- APPEND_EVENTS takes them) the rest.
-- - The worker's own running attempt: its last events are appended, the
--   result recorded (its `exit` event after them), every key of the job
--   set to expire, and only then the id dropped from the processing list:
--   {'finished'}.
-- - An attempt the platform gave up on (a `worker_lost` or
--   `deadline_exceeded` verdict, or a retry) whose real result comes
--   within the late-result window, and is not itself an `error`: that
--   result wins. A verdict is replaced (the new `exit` says which `seq` it
--   replaces); a retry waiting in the queue is withdrawn; a retry running
--   elsewhere is cancelled: {'late'}.
-- - Anything else (the job ended otherwise, or belongs to another attempt
--   now) is only dropped from the processing list: {'stale', status}, or
--   {'missing'} when the job is gone.
local current = redis.call('HGET', job_key, 'status')
if not current then
  redis.call('LREM', processing_key, 0, id)
  return {'missing'}
end
local outputs = {ARGV[REST], ARGV[REST + 1], ARGV[REST + 2], ARGV[REST + 3]}
if current == 'running' and redis.call('HGET', job_key, 'worker') == worker
  and redis.call('HGET', job_key, 'attempts') == attempt then
  local seq, from = settle_job(job_key, events_key, stdin_key, id, status, result, outputs, now_ms, ttl, nil, nil, REST + 4)
  if not seq then
    return refused(from, status)
  end
  redis.call('LREM', processing_key, 0, id)
  return {'finished'}
end
if status ~= 'error' and redis.call('HGET', job_key, 'lost_worker') == worker
  and redis.call('HGET', job_key, 'lost_attempt') == attempt
  and tonumber(now_ms) <= tonumber(redis.call('HGET', job_key, 'lost_until') or '0') then
  local may, from = may_become(job_key, status)
  if not may then
    return refused(from, status)
  end
  -- Its last events are left out, as APPEND_EVENTS leaves out a given-up
  -- attempt's: they would mix into the verdict's or a retry's stream.
  local replaces = redis.call('HGET', job_key, 'verdict_seq')
  if current == 'queued' then
    withdraw(job_key, id, queue_key, tenants_key, tenant_turns_key)
  elseif current == 'running' then
    if redis.call('HGET', job_key, 'cancel_requested') ~= '1' then
      redis.call('HSET', job_key, 'cancel_requested', '1')
      redis.call('XADD', stdin_key, '*', 'type', 'cancel')
    end
  end
  -- The stdin stream exists now if it must: settle_job sets it to expire.
  settle_job(job_key, events_key, stdin_key, id, status, result, outputs, now_ms, ttl, nil, replaces)
  redis.call('HSET', job_key, 'worker', worker)
  redis.call('LREM', processing_key, 0, id)
  return {'late'}
end
redis.call('LREM', processing_key, 0, id)
return {'stale', current}
