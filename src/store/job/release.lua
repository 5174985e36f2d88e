-- RELEASE: gives back a job a worker claimed but will not start (it is
-- shutting down): drops the id from the processing list and, if the job is
-- still queued, pushes it back at the head of the queue (the right end,
-- where claims pop), so it is the next job claimed. Replies {'requeued'} |
-- {'dropped'} (no longer queued, e.g. cancelled) | {'absent'} (not in the
-- processing list).
local removed = redis.call('LREM', processing_key, 0, id)
if removed == 0 then
  return {'absent'}
end
if redis.call('HGET', job_key, 'status') == 'queued' then
  redis.call('RPUSH', queue_key, id)
  return {'requeued'}
end
return {'dropped'}
