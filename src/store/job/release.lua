-- RELEASE: gives back a job a worker claimed but will not start (it is
-- shutting down): drops the id from the processing list and, if the job is
-- still queued, puts it back at the claim end of its user's queue, its
-- user and key at the front of their rings if they had left them, and its
-- turn at the claim end of jobs:queue (see enqueue). Replies {'requeued'} |
-- {'dropped'} (no longer queued, e.g. cancelled) | {'absent'} (not in the
-- processing list).
local removed = redis.call('LREM', processing_key, 0, id)
if removed == 0 then
  return {'absent'}
end
if redis.call('HGET', job_key, 'status') == 'queued' then
  enqueue(job_key, id, true, queue_key, tenants_key)
  return {'requeued'}
end
return {'dropped'}
