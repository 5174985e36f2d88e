-- CANCEL: a queued job is cancelled at once and never starts; a running
-- one gets `cancel_requested` and a `cancel` control message (once), which
-- its worker acts on; the stream is never trimmed, so nothing can push the
-- message out. Replies {'cancelled'} | {'requested'} | {'missing'} |
-- {'ended', status} (a job that had already ended, cancelled or not).
local status = redis.call('HGET', job_key, 'status')
if not status then
  return {'missing'}
end
if status == 'queued' then
  local seq, from = settle_job(job_key, events_key, stdin_key, id, 'cancelled', result, nil, now_ms, ttl, nil)
  if not seq then
    return refused(from, 'cancelled')
  end
  withdraw(job_key, id, queue_key, tenants_key, tenant_turns_key)
  return {'cancelled'}
end
if status == 'running' then
  if redis.call('HGET', job_key, 'cancel_requested') ~= '1' then
    redis.call('HSET', job_key, 'cancel_requested', '1')
    redis.call('XADD', stdin_key, '*', 'type', 'cancel')
  end
  return {'requested'}
end
return {'ended', status}
