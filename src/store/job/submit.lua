-- SUBMIT: admits a new job and enqueues it, in one step with its
-- idempotency record. Outcomes: accepted|existing|conflict (job id),
-- queue_full (depth), key_limit (active count), key_storage (bytes the key
-- holds), quota_exceeded (the key entry's option, what is used today).
-- Before the budget is checked, entries of the key whose keys have
-- expired are released, a bounded number per call.
if idempotency_key ~= '' then
  local existing = redis.call('HGET', idempotency_key, 'job')
  if existing then
    if redis.call('HGET', idempotency_key, 'hash') == body_hash then
      return {'existing', existing}
    end
    return {'conflict', existing}
  end
end
local over = over_quota(usage_key, user, key_cpu_quota_s, user_cpu_quota_s, user_jobs_quota)
if over then
  return over
end
local may, from = may_become(job_key, 'queued')
if not may then
  return refused(from, 'queued')
end
local depth = redis.call('LLEN', queue_key)
if depth >= tonumber(max_depth) then
  return {'queue_full', tostring(depth)}
end
local limit = tonumber(key_limit)
local active = redis.call('SCARD', active_key)
if limit > 0 and active >= limit then
  return {'key_limit', tostring(active)}
end
local now = tonumber(now_ms)
local expired = redis.call('ZRANGEBYSCORE', expiry_key, '-inf', now, 'LIMIT', 0, 1000)
for _, member in ipairs(expired) do
  local bytes = tonumber(redis.call('HGET', stored_key, member) or '0')
  redis.call('HDEL', stored_key, member)
  redis.call('HINCRBY', stored_key, 'total', -bytes)
  redis.call('ZREM', expiry_key, member)
end
local held = tonumber(redis.call('HGET', stored_key, 'total') or '0')
local need = tonumber(reserve)
if idempotency_key ~= '' then
  need = need + IDEMPOTENCY_BYTES
end
if held + need > tonumber(storage_budget) then
  return {'key_storage', tostring(held)}
end
set_status(job_key, 'queued')
redis.call('HSET', job_key, 'id', id, 'spec', spec, 'api_key', api_key,
  'user', user, 'language', language, 'attempts', 0, 'created_ms', now_ms,
  'active_key', active_key, 'metadata', metadata, 'max_attempts', max_attempts,
  'stored_key', stored_key, 'expiry_key', expiry_key, 'wall_budget_ms', wall_budget_ms)
redis.call('SADD', active_key, id)
redis.call('HSET', stored_key, 'j:' .. id, reserve)
redis.call('ZADD', expiry_key, '+inf', 'j:' .. id)
redis.call('HINCRBY', stored_key, 'total', need)
append_event(events_key, job_key, '{"type":"status","status":"queued"}')
if idempotency_key ~= '' then
  redis.call('HSET', idempotency_key, 'job', id, 'hash', body_hash)
  redis.call('EXPIRE', idempotency_key, idempotency_ttl)
  redis.call('HSET', stored_key, idempotency_member, IDEMPOTENCY_BYTES)
  redis.call('ZADD', expiry_key, now + tonumber(idempotency_ttl) * 1000, idempotency_member)
end
count_submission(job_key, usage_key, usage_prefix, user, now, usage_ttl)
redis.call('LPUSH', queue_key, id)
redis.call('LPUSH', recent_key, id)
redis.call('LTRIM', recent_key, 0, tonumber(recent_last))
return {'accepted', id}
