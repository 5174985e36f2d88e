-- START: marks a claimed job running on this worker (one more attempt)
-- and stores its deadline: now + the worker's start timeout and grace
-- (slack_ms) + the wall budget resolved at submit. Replies {'start', spec
-- (empty unless with_spec is 1), created_ms, attempts, deadline_ms ('' for
-- a job submitted without a wall budget), api_key}. Else {'skip', why}, and the id
-- leaves the processing list: why is the job's status, or 'missing'. A job
-- no longer in this worker's processing list (a reaper took it back while
-- this worker stalled) is not started: {'skip', 'not_claimed'}. A job this
-- worker already started (a retried start whose first reply was lost)
-- stays claimed: {'skip', 'running'}.
if not redis.call('LPOS', processing_key, id) then
  return {'skip', 'not_claimed'}
end
local status = redis.call('HGET', job_key, 'status')
if status == 'running' and redis.call('HGET', job_key, 'worker') == worker then
  return {'skip', 'running'}
end
if status ~= 'queued' then
  redis.call('LREM', processing_key, 0, id)
  return {'skip', status or 'missing'}
end
local ok, from = set_status(job_key, 'running')
if not ok then
  return refused(from, 'running')
end
local deadline = ''
local budget = redis.call('HGET', job_key, 'wall_budget_ms')
if budget then
  deadline = tostring(tonumber(now_ms) + tonumber(slack_ms) + tonumber(budget))
  redis.call('HSET', job_key, 'deadline_ms', deadline)
else
  redis.call('HDEL', job_key, 'deadline_ms')
end
redis.call('HSET', job_key, 'worker', worker, 'started_ms', now_ms, 'host', host)
note_history(job_key)
local attempts = redis.call('HINCRBY', job_key, 'attempts', 1)
append_event(events_key, job_key, '{"type":"status","status":"running","worker":"' .. worker .. '"}')
local spec = ''
if with_spec == '1' then
  spec = redis.call('HGET', job_key, 'spec')
end
return {'start', spec, redis.call('HGET', job_key, 'created_ms'), tostring(attempts), deadline,
  redis.call('HGET', job_key, 'api_key') or ''}
