//! Lua scripts for every state change that touches more than one key, so each
//! change is atomic: no two processes can both start, finish or cancel a job.

/// KEYS: queue, job, active set of the API key, idempotency key (or "").
/// ARGV: id, spec, api key name, language, created_ms, max depth, per-key
/// limit (0 = none), body hash, idempotency ttl (s), metadata.
/// Returns {outcome, detail}: accepted|existing|conflict (job id),
/// queue_full (depth), key_limit (active count).
pub const SUBMIT: &str = r"
if KEYS[4] ~= '' then
  local existing = redis.call('HGET', KEYS[4], 'job')
  if existing then
    if redis.call('HGET', KEYS[4], 'hash') == ARGV[8] then
      return {'existing', existing}
    end
    return {'conflict', existing}
  end
end
local depth = redis.call('LLEN', KEYS[1])
if depth >= tonumber(ARGV[6]) then
  return {'queue_full', tostring(depth)}
end
local limit = tonumber(ARGV[7])
local active = redis.call('SCARD', KEYS[3])
if limit > 0 and active >= limit then
  return {'key_limit', tostring(active)}
end
redis.call('HSET', KEYS[2], 'id', ARGV[1], 'spec', ARGV[2], 'api_key', ARGV[3],
  'language', ARGV[4], 'status', 'queued', 'attempts', 0, 'created_ms', ARGV[5],
  'active_key', KEYS[3], 'metadata', ARGV[10])
redis.call('SADD', KEYS[3], ARGV[1])
if KEYS[4] ~= '' then
  redis.call('HSET', KEYS[4], 'job', ARGV[1], 'hash', ARGV[8])
  redis.call('EXPIRE', KEYS[4], ARGV[9])
end
redis.call('LPUSH', KEYS[1], ARGV[1])
return {'accepted', ARGV[1]}
";

/// KEYS: job, the worker's processing list. ARGV: id, worker id, now_ms.
/// Returns {'start', spec, created_ms, attempts} when the job was queued (it
/// is now running on this worker), else {'skip', status} and the id is
/// dropped from the processing list.
pub const START: &str = r"
local status = redis.call('HGET', KEYS[1], 'status')
if status ~= 'queued' then
  redis.call('LREM', KEYS[2], 0, ARGV[1])
  return {'skip', status or 'missing'}
end
redis.call('HSET', KEYS[1], 'status', 'running', 'worker', ARGV[2], 'started_ms', ARGV[3])
local attempts = redis.call('HINCRBY', KEYS[1], 'attempts', 1)
return {'start', redis.call('HGET', KEYS[1], 'spec'), redis.call('HGET', KEYS[1], 'created_ms'),
  tostring(attempts)}
";

/// KEYS: job, the worker's processing list, events stream, stdin stream.
/// ARGV: id, status, result, now_ms, ttl (s).
/// Records the result unless the job is already terminal (the first terminal
/// status wins), sets every key of the job to expire, and only then drops the
/// id from the processing list. Returns the status the job had.
pub const FINISH: &str = r"
local current = redis.call('HGET', KEYS[1], 'status')
if not current then
  redis.call('LREM', KEYS[2], 0, ARGV[1])
  return 'missing'
end
if current == 'queued' or current == 'running' then
  redis.call('HSET', KEYS[1], 'status', ARGV[2], 'result', ARGV[3], 'finished_ms', ARGV[4])
end
local active = redis.call('HGET', KEYS[1], 'active_key')
if active then
  redis.call('SREM', active, ARGV[1])
end
redis.call('EXPIRE', KEYS[1], ARGV[5])
redis.call('EXPIRE', KEYS[3], ARGV[5])
redis.call('EXPIRE', KEYS[4], ARGV[5])
redis.call('LREM', KEYS[2], 0, ARGV[1])
return current
";

/// KEYS: job, queue, stdin stream, events stream. ARGV: id, now_ms, ttl (s),
/// result of a job cancelled before it started.
/// A queued job is cancelled at once and never starts; a running one gets a
/// `cancel` control message its worker acts on. Returns cancelled|requested|
/// missing|finished:<terminal status> (the prefix keeps a job that had
/// already been cancelled apart from one cancelled now).
pub const CANCEL: &str = r"
local status = redis.call('HGET', KEYS[1], 'status')
if not status then
  return 'missing'
end
if status == 'queued' then
  redis.call('LREM', KEYS[2], 0, ARGV[1])
  redis.call('HSET', KEYS[1], 'status', 'cancelled', 'finished_ms', ARGV[2], 'result', ARGV[4])
  local active = redis.call('HGET', KEYS[1], 'active_key')
  if active then
    redis.call('SREM', active, ARGV[1])
  end
  redis.call('EXPIRE', KEYS[1], ARGV[3])
  redis.call('EXPIRE', KEYS[3], ARGV[3])
  redis.call('EXPIRE', KEYS[4], ARGV[3])
  return 'cancelled'
end
if status == 'running' then
  redis.call('HSET', KEYS[1], 'cancel_requested', '1')
  redis.call('XADD', KEYS[3], 'MAXLEN', '~', '10000', '*', 'type', 'cancel')
  return 'requested'
end
return 'finished:' .. status
";

/// KEYS: queue, the worker's processing list, job. ARGV: id.
/// Gives back a job a worker claimed but will not start (it is shutting
/// down): drops the id from the processing list and, if the job is still
/// queued, pushes it back at the head of the queue (the right end, where
/// claims pop), so it is the next job claimed. Returns requeued|dropped
/// (no longer queued, e.g. cancelled)|absent (not in the processing list).
pub const RELEASE: &str = r"
local removed = redis.call('LREM', KEYS[2], 0, ARGV[1])
if removed == 0 then
  return 'absent'
end
if redis.call('HGET', KEYS[3], 'status') == 'queued' then
  redis.call('RPUSH', KEYS[1], ARGV[1])
  return 'requeued'
end
return 'dropped'
";
