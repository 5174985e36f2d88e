-- REAP: settles one job of a worker whose heartbeat expired, once:
-- nothing happens while the heartbeat lives ({'alive'}, unless `own`: the
-- worker itself, restarted under the same id, recovers its own list), and
-- a job not in the list is {'absent'} (another reaper reaped it). A turn
-- (`id` is TURN: the worker died between the two halves of a claim) goes
-- back to jobs:queue ({'turn'}). Then, by status:
-- - `queued` (claimed, never started): back to the claim end of the queue
--   while it has requeues left ({'requeued', requeues}), else `error` and
--   the dead-letter list ({'dead', requeues});
-- - `running` on that worker: cancelled if a client asked for it
--   ({'cancelled'}); run again if it has attempts left (`max_attempts`)
--   and the retry is allowed (`retry` 1: its sandbox is known gone;
--   {'retried', attempts}), or left in the list until it is (`retry` 0;
--   {'waiting', attempts}); else (or `retry` never) `error`/`worker_lost`
--   ({'worker_lost', attempts}). Either way the lost attempt's real result
--   can still win within the late-result window;
-- - running elsewhere ({'moved'}), ended ({'terminal', status}) or gone
--   ({'missing'}): only dropped from the list.
if own ~= '1' and redis.call('EXISTS', heartbeat_key) == 1 then
  return {'alive'}
end
if id == TURN then
  -- A claim that stopped between its two halves: the turn goes back.
  if redis.call('LREM', processing_key, 1, TURN) == 0 then
    return {'absent'}
  end
  redis.call('RPUSH', queue_key, TURN)
  return {'turn'}
end
if not redis.call('LPOS', processing_key, id) then
  return {'absent'}
end
local status = redis.call('HGET', job_key, 'status')
if not status then
  redis.call('LREM', processing_key, 0, id)
  return {'missing'}
end
if status == 'queued' then
  local requeues = tonumber(redis.call('HGET', job_key, 'requeues') or '0')
  if requeues < tonumber(max_requeues) then
    redis.call('LREM', processing_key, 0, id)
    requeues = redis.call('HINCRBY', job_key, 'requeues', 1)
    enqueue(job_key, id, true, queue_key, tenants_key)
    return {'requeued', tostring(requeues)}
  end
  local seq, from = settle_job(job_key, events_key, stdin_key, id, 'error', dead_result, nil, now_ms, ttl, nil)
  if not seq then
    return refused(from, 'error')
  end
  redis.call('LREM', processing_key, 0, id)
  redis.call('LPUSH', dead_key, id)
  redis.call('LTRIM', dead_key, 0, 9999)
  return {'dead', tostring(requeues)}
end
if status ~= 'running' then
  redis.call('LREM', processing_key, 0, id)
  return {'terminal', status}
end
if redis.call('HGET', job_key, 'worker') ~= worker then
  redis.call('LREM', processing_key, 0, id)
  return {'moved'}
end
local attempts = redis.call('HGET', job_key, 'attempts') or '0'
if redis.call('HGET', job_key, 'cancel_requested') == '1' then
  local seq, from = settle_job(job_key, events_key, stdin_key, id, 'cancelled', cancelled_result, nil,
    now_ms, ttl, nil)
  if not seq then
    return refused(from, 'cancelled')
  end
  redis.call('LREM', processing_key, 0, id)
  return {'cancelled'}
end
if retry ~= 'never' and tonumber(attempts) < tonumber(redis.call('HGET', job_key, 'max_attempts') or '1') then
  if retry ~= '1' then
    return {'waiting', attempts}
  end
  local ok, from = set_status(job_key, 'queued')
  if not ok then
    return refused(from, 'queued')
  end
  redis.call('LREM', processing_key, 0, id)
  redis.call('HDEL', job_key, 'started_ms', 'host', 'deadline_ms')
  note_history(job_key)
  give_up(job_key, worker, attempts, now_ms, late_window_ms, nil)
  append_event(events_key, job_key, '{"type":"attempt","attempt":' .. (tonumber(attempts) + 1)
    .. ',"reason":"worker_lost","worker":"' .. worker .. '"}')
  append_event(events_key, job_key, '{"type":"status","status":"queued"}')
  enqueue(job_key, id, true, queue_key, tenants_key)
  return {'retried', attempts}
end
local seq, from = settle_verdict(job_key, events_key, stdin_key, id, running_result, now_ms, ttl,
  worker, attempts, late_window_ms)
if not seq then
  return refused(from, 'error')
end
redis.call('LREM', processing_key, 0, id)
return {'worker_lost', attempts}
