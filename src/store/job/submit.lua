-- SUBMIT: admits a new job and enqueues it in its user's queue (a turn in
-- jobs:queue), in one step with its idempotency record. Outcomes:
-- accepted|existing|conflict (job id), queue_full (depth), key_limit
-- (active count), user_active_limit (the user's active count),
-- user_rate_limit (ms until the user may submit again), key_storage
-- (bytes the key holds), quota_exceeded (the key entry's option, what is
-- used today). Before the budget is checked, entries of the key whose keys have
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
local per_user = tonumber(user_limit)
local user_active = tonumber(redis.call('HGET', user_active_key, user) or '0')
if per_user > 0 and user_active >= per_user then
  return {'user_active_limit', tostring(user_active)}
end
local now = tonumber(now_ms)
-- The user's submission rate, by GCRA: `user_rate_per_minute` a minute, as many at
-- once after a quiet minute.
local rate = tonumber(user_rate_per_minute)
local next_arrival
if rate > 0 then
  local interval = 60000 / rate
  local arrival = math.max(tonumber(redis.call('GET', user_rate_key) or '0'), now)
  local allowed_from = arrival + interval - 60000
  if now < allowed_from then
    return {'user_rate_limit', tostring(math.ceil(allowed_from - now))}
  end
  next_arrival = arrival + interval
end
sweep_storage(stored_key, expiry_key, now)
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
  'stored_key', stored_key, 'expiry_key', expiry_key, 'storage_budget', storage_budget,
  'wall_budget_ms', wall_budget_ms,
  'user_queue', user_queue_key, 'users_ring', users_key, 'user_active_key', user_active_key)
note_history(job_key, summary_key, key_history_key, user_history_key, history_ms)
redis.call('SADD', active_key, id)
redis.call('HINCRBY', user_active_key, user, 1)
if next_arrival then
  redis.call('SET', user_rate_key, tostring(math.ceil(next_arrival)), 'PX', 60000)
end
redis.call('HSET', tenant_weights_key, users_key, weight)
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
enqueue(job_key, id, false, queue_key, tenants_key)
redis.call('LPUSH', recent_key, id)
redis.call('LTRIM', recent_key, 0, tonumber(recent_last))
return {'accepted', id}
