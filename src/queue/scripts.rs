//! Lua scripts for every state change that touches more than one key, so each
//! change is atomic: no two processes can both start, finish or cancel a job.
//!
//! Every script that changes a job's status also appends the matching event
//! to the job's events stream in the same step, so a client following the
//! stream sees exactly the statuses the job went through, and the `exit`
//! event exactly once.

/// Prepends the shared helpers to a script:
/// `append_event(stream, job, json)` numbers the event with the job's next
/// `seq` (a counter in the job hash) and adds it with the stream id
/// `<seq>-0`, so clients resume by `seq`; `exit_event(status, result)` is the
/// terminal event's JSON, built around the result's JSON without re-encoding
/// it; `retire_job` takes a finished job out of its API key's active set and
/// sets its keys to expire; `settle_job` ends a job: terminal status, result,
/// the `exit` event, then `retire_job`. Every path that ends a job (finish,
/// cancel, the reaper, the stuck guard) goes through `settle_job`.
macro_rules! with_events {
    ($body:literal) => {
        concat!(
            r#"
local function append_event(stream, job, event)
  local seq = redis.call('HINCRBY', job, 'event_seq', 1)
  redis.call('XADD', stream, 'MAXLEN', '~', '20000', seq .. '-0', 'event', event)
  return seq
end
local function exit_event(status, result)
  return '{"type":"exit","status":"' .. status .. '","result":' .. result .. '}'
end
local function retire_job(job, events, stdin, id, ttl)
  local active = redis.call('HGET', job, 'active_key')
  if active then
    redis.call('SREM', active, id)
  end
  redis.call('EXPIRE', job, ttl)
  redis.call('EXPIRE', events, ttl)
  redis.call('EXPIRE', stdin, ttl)
end
local function settle_job(job, events, stdin, id, status, result, now, ttl)
  redis.call('HSET', job, 'status', status, 'result', result, 'finished_ms', now)
  append_event(events, job, exit_event(status, result))
  retire_job(job, events, stdin, id, ttl)
end
"#,
            $body
        )
    };
}

/// KEYS: queue, job, active set of the API key, idempotency key (or ""),
/// events stream, recent jobs list.
/// ARGV: id, spec, api key name, language, created_ms, max depth, per-key
/// limit (0 = none), body hash, idempotency ttl (s), metadata, last index
/// of the recent jobs list kept.
/// Returns {outcome, detail}: accepted|existing|conflict (job id),
/// queue_full (depth), key_limit (active count).
pub const SUBMIT: &str = with_events!(
    r#"
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
append_event(KEYS[5], KEYS[2], '{"type":"status","status":"queued"}')
if KEYS[4] ~= '' then
  redis.call('HSET', KEYS[4], 'job', ARGV[1], 'hash', ARGV[8])
  redis.call('EXPIRE', KEYS[4], ARGV[9])
end
redis.call('LPUSH', KEYS[1], ARGV[1])
redis.call('LPUSH', KEYS[6], ARGV[1])
redis.call('LTRIM', KEYS[6], 0, tonumber(ARGV[11]))
return {'accepted', ARGV[1]}
"#
);

/// KEYS: job, the worker's processing list, events stream.
/// ARGV: id, worker id, now_ms, with spec (1|0).
/// Returns {'start', spec (empty unless asked for), created_ms, attempts}
/// when the job was queued (it
/// is now running on this worker), else {'skip', status} and the id is
/// dropped from the processing list. A job no longer in this worker's
/// processing list (a reaper took it back while this worker stalled) is not
/// started: {'skip', 'not_claimed'}. A job this worker already started (a
/// retried start whose first reply was lost) stays claimed: {'skip', 'running'}.
pub const START: &str = with_events!(
    r#"
if not redis.call('LPOS', KEYS[2], ARGV[1]) then
  return {'skip', 'not_claimed'}
end
local status = redis.call('HGET', KEYS[1], 'status')
if status == 'running' and redis.call('HGET', KEYS[1], 'worker') == ARGV[2] then
  return {'skip', 'running'}
end
if status ~= 'queued' then
  redis.call('LREM', KEYS[2], 0, ARGV[1])
  return {'skip', status or 'missing'}
end
redis.call('HSET', KEYS[1], 'status', 'running', 'worker', ARGV[2], 'started_ms', ARGV[3])
local attempts = redis.call('HINCRBY', KEYS[1], 'attempts', 1)
append_event(KEYS[3], KEYS[1], '{"type":"status","status":"running","worker":"' .. ARGV[2] .. '"}')
local spec = ''
if ARGV[4] == '1' then
  spec = redis.call('HGET', KEYS[1], 'spec')
end
return {'start', spec, redis.call('HGET', KEYS[1], 'created_ms'), tostring(attempts)}
"#
);

/// KEYS: job, the worker's processing list, events stream, stdin stream.
/// ARGV: id, status, result, now_ms, ttl (s).
/// Records the result unless the job is already terminal (the first terminal
/// status wins), sets every key of the job to expire, and only then drops the
/// id from the processing list. Returns the status the job had.
pub const FINISH: &str = with_events!(
    r#"
local current = redis.call('HGET', KEYS[1], 'status')
if not current then
  redis.call('LREM', KEYS[2], 0, ARGV[1])
  return 'missing'
end
if current == 'queued' or current == 'running' then
  settle_job(KEYS[1], KEYS[3], KEYS[4], ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5])
else
  retire_job(KEYS[1], KEYS[3], KEYS[4], ARGV[1], ARGV[5])
end
redis.call('LREM', KEYS[2], 0, ARGV[1])
return current
"#
);

/// KEYS: job, queue, stdin stream, events stream. ARGV: id, now_ms, ttl (s),
/// result of a job cancelled before it started.
/// A queued job is cancelled at once and never starts; a running one gets a
/// `cancel` control message its worker acts on. Returns cancelled|requested|
/// missing|finished:<terminal status> (the prefix keeps a job that had
/// already been cancelled apart from one cancelled now).
pub const CANCEL: &str = with_events!(
    r#"
local status = redis.call('HGET', KEYS[1], 'status')
if not status then
  return 'missing'
end
if status == 'queued' then
  redis.call('LREM', KEYS[2], 0, ARGV[1])
  settle_job(KEYS[1], KEYS[4], KEYS[3], ARGV[1], 'cancelled', ARGV[4], ARGV[2], ARGV[3])
  return 'cancelled'
end
if status == 'running' then
  redis.call('HSET', KEYS[1], 'cancel_requested', '1')
  redis.call('XADD', KEYS[3], 'MAXLEN', '~', '10000', '*', 'type', 'cancel')
  return 'requested'
end
return 'finished:' .. status
"#
);

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

/// KEYS: the dead worker's processing list, its heartbeat, job, queue,
/// dead-letter list, events stream, stdin stream.
/// ARGV: id, now_ms, ttl (s), most requeues, result of a running job whose
/// worker was lost, result of a queued job that ran out of requeues.
/// Settles one job of a worker whose heartbeat expired, once: the id leaves
/// the processing list first (a second reaper finds it gone: `absent`), and
/// nothing happens while the heartbeat lives (`alive`: it came back). A job
/// still `queued` (claimed, never started) goes back to the claim end of the
/// queue while it has requeues left, else it ends as `error` and goes to the
/// dead-letter list; a `running` one ends as `error` (it may have had effects:
/// never run twice); a terminal one or a missing hash is only dropped.
/// Returns {requeued, requeues} | {dead, requeues} | {worker_lost, ''} |
/// {terminal, status} | {missing, ''} | {absent, ''} | {alive, ''}.
pub const REAP_JOB: &str = with_events!(
    r#"
if redis.call('EXISTS', KEYS[2]) == 1 then
  return {'alive', ''}
end
if redis.call('LREM', KEYS[1], 0, ARGV[1]) == 0 then
  return {'absent', ''}
end
local status = redis.call('HGET', KEYS[3], 'status')
if not status then
  return {'missing', ''}
end
local function settle(result)
  settle_job(KEYS[3], KEYS[6], KEYS[7], ARGV[1], 'error', result, ARGV[2], ARGV[3])
end
if status == 'queued' then
  local requeues = tonumber(redis.call('HGET', KEYS[3], 'requeues') or '0')
  if requeues < tonumber(ARGV[4]) then
    requeues = redis.call('HINCRBY', KEYS[3], 'requeues', 1)
    redis.call('RPUSH', KEYS[4], ARGV[1])
    return {'requeued', tostring(requeues)}
  end
  settle(ARGV[6])
  redis.call('LPUSH', KEYS[5], ARGV[1])
  redis.call('LTRIM', KEYS[5], 0, 9999)
  return {'dead', tostring(requeues)}
end
if status == 'running' then
  settle(ARGV[5])
  return {'worker_lost', ''}
end
return {'terminal', status}
"#
);

/// KEYS: workers set, the worker's heartbeat, its processing list.
/// ARGV: worker id.
/// Forgets a dead worker whose processing list is empty: out of the set,
/// its list deleted. Returns forgotten | alive (the heartbeat is back) |
/// busy (the list still holds ids) | absent (not in the set: another
/// reaper forgot it first).
pub const FORGET_WORKER: &str = r"
if redis.call('EXISTS', KEYS[2]) == 1 then
  return 'alive'
end
if redis.call('LLEN', KEYS[3]) > 0 then
  return 'busy'
end
if redis.call('SREM', KEYS[1], ARGV[1]) == 0 then
  return 'absent'
end
redis.call('DEL', KEYS[3])
return 'forgotten'
";

/// KEYS: job, the worker's processing list, events stream, stdin stream.
/// ARGV: id, worker id, started_ms, now_ms, ttl (s), result.
/// Settles a job that outlived its deadline on a worker that is alive but
/// silent about it: only if it is still the same run (running, on that
/// worker, started at that time). Like FINISH: result, expiry, out of the
/// active set and of the processing list. The worker's own result, if it
/// ever comes, loses (the first terminal status wins). Returns 1 if settled.
pub const SETTLE_STUCK: &str = with_events!(
    r#"
if redis.call('HGET', KEYS[1], 'status') ~= 'running'
  or redis.call('HGET', KEYS[1], 'worker') ~= ARGV[2]
  or redis.call('HGET', KEYS[1], 'started_ms') ~= ARGV[3] then
  return 0
end
settle_job(KEYS[1], KEYS[3], KEYS[4], ARGV[1], 'error', ARGV[6], ARGV[4], ARGV[5])
redis.call('LREM', KEYS[2], 0, ARGV[1])
return 1
"#
);

/// KEYS: job, events stream. ARGV: event JSON objects (without `seq`).
/// Appends a running job's events (stages, output); nothing once the job is
/// terminal or gone, so no event follows `exit`. Returns the last `seq`, or 0
/// when nothing was appended.
pub const APPEND_EVENTS: &str = with_events!(
    r#"
if redis.call('HGET', KEYS[1], 'status') ~= 'running' then
  return 0
end
local seq = 0
for i = 1, #ARGV do
  seq = append_event(KEYS[2], KEYS[1], ARGV[i])
end
return seq
"#
);

/// KEYS: job, stdin stream. ARGV: most stdin bytes a job may be sent, bytes
/// of stdin this message carries (0 for other messages), then the message's
/// field/value pairs.
/// Appends a control message from a stream client (stdin, stdin close, a
/// signal) for the job's worker, only while the job is queued or running, so
/// nothing is added to the stream of an ended job (its keys expire) and no
/// key is created for a gone one. Stdin is counted in the job hash
/// (`stdin_bytes`, across every connection); a message that would take the
/// count over the budget is refused whole and not counted.
/// Returns {sent, bytes used} | {over, bytes used} | {ended, status} |
/// {missing, ''}.
pub const SEND_INPUT: &str = r"
local status = redis.call('HGET', KEYS[1], 'status')
if not status then
  return {'missing', ''}
end
if status ~= 'queued' and status ~= 'running' then
  return {'ended', status}
end
local used = tonumber(redis.call('HGET', KEYS[1], 'stdin_bytes') or '0')
local bytes = tonumber(ARGV[2])
if bytes > 0 then
  if used + bytes > tonumber(ARGV[1]) then
    return {'over', tostring(used)}
  end
  used = redis.call('HINCRBY', KEYS[1], 'stdin_bytes', bytes)
end
local command = {'XADD', KEYS[2], 'MAXLEN', '~', '10000', '*'}
for i = 3, #ARGV do
  command[#command + 1] = ARGV[i]
end
redis.call(unpack(command))
return {'sent', tostring(used)}
";
