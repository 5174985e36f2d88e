//! Lua scripts for every state change that touches more than one key, so each
//! change is atomic: no two processes can both start, finish or cancel a job.
//!
//! Every script that changes a job's status also appends the matching event
//! to the job's events stream in the same step, so a client following the
//! stream sees exactly the statuses the job went through. The job state
//! table in `docs/ARCHITECTURE.md` lists which script moves a job from which
//! status to which; these scripts are the only places that do.
//!
//! Storage (issue 11): output is stored as raw bytes, never as JSON text
//! (a control byte would take six): output events are stream entries
//! `t <stdout|stderr> d <bytes>`, and the result's output lives in four hash
//! fields beside the result's JSON. The `exit` event is stored without the
//! result (entry `x <json>`); readers put the job's one stored result into
//! it. A platform verdict (`worker_lost`, `deadline_exceeded`) carries its
//! own small result (entry `event <json>`), because a late real result may
//! replace the job's. Every job's bytes count against its API key's storage
//! budget (`apikey:<name>:stored`): a reservation at submit, the actual size
//! once it ends, released when its keys expire.

/// Bytes counted for one stream entry besides its payload.
pub const EVENT_OVERHEAD: u64 = 64;
/// Bytes counted for a job besides its spec, events and result: the hash's
/// other fields, the status events, the keys themselves.
pub const JOB_OVERHEAD: u64 = 4096;
/// Bytes counted for one idempotency record.
pub const IDEMPOTENCY_BYTES: u64 = 256;
/// Most output events one job's stream takes; further output is left out
/// of the stream (the result keeps it).
pub const MAX_OUTPUT_EVENTS: u64 = 4096;

/// Prepends the shared helpers to a script:
/// - `append_event(stream, job, json)` numbers the event with the job's next
///   `seq` (a counter in the job hash) and adds it with the stream id
///   `<seq>-0`, so clients resume by `seq`; `append_entry` does the same for
///   any fields (raw output, an exit to be completed);
/// - `exit_event(status, replaces)` is the stored form of the `exit` event;
/// - `account(job, id, expires_ms)` sets the job's entry in its key's
///   storage budget to the job's actual size;
/// - `retire_job` takes a finished job out of its API key's active set,
///   sets its keys to expire and accounts it;
/// - `settle_job` ends a job: terminal status, result and its raw output,
///   the `exit` event (stored with `exit`'s JSON when given, else to be
///   completed with the stored result, saying which `seq` it `replaces`
///   when it does), then `retire_job`. Every path that ends a job
///   (finish, cancel, the reaper, the stuck guard) goes through it. It
///   clears the late-result record; a verdict sets it again right after.
/// - `give_up(job, worker, attempt, now, window, seq)` records that the
///   platform gave up on `worker`'s attempt, so its real result, if it
///   still comes within the window, can win.
macro_rules! with_events {
    ($body:literal) => {
        concat!(
            r#"
local OUT_FIELDS = {'out:compile:stdout', 'out:compile:stderr', 'out:run:stdout', 'out:run:stderr'}
local function append_entry(stream, job, ...)
  local seq = redis.call('HINCRBY', job, 'event_seq', 1)
  redis.call('XADD', stream, seq .. '-0', ...)
  return seq
end
local function append_event(stream, job, event)
  return append_entry(stream, job, 'event', event)
end
local function exit_event(status, replaces)
  local event = '{"type":"exit","status":"' .. status .. '"'
  if replaces then
    event = event .. ',"replaces":' .. replaces
  end
  return event .. '}'
end
local function account(job, id, expires_ms)
  local stored = redis.call('HGET', job, 'stored_key')
  if not stored then
    return
  end
  local actual = 4096 + redis.call('HSTRLEN', job, 'spec') + redis.call('HSTRLEN', job, 'result')
    + tonumber(redis.call('HGET', job, 'event_bytes') or '0')
    + tonumber(redis.call('HGET', job, 'control_bytes') or '0')
  for _, field in ipairs(OUT_FIELDS) do
    actual = actual + redis.call('HSTRLEN', job, field)
  end
  local member = 'j:' .. id
  local old = tonumber(redis.call('HGET', stored, member) or '0')
  redis.call('HSET', stored, member, actual)
  redis.call('HINCRBY', stored, 'total', actual - old)
  redis.call('ZADD', redis.call('HGET', job, 'expiry_key'), expires_ms, member)
end
local function retire_job(job, events, stdin, id, now, ttl)
  local active = redis.call('HGET', job, 'active_key')
  if active then
    redis.call('SREM', active, id)
  end
  redis.call('EXPIRE', job, ttl)
  redis.call('EXPIRE', events, ttl)
  redis.call('EXPIRE', stdin, ttl)
  account(job, id, tonumber(now) + tonumber(ttl) * 1000)
end
local function settle_job(job, events, stdin, id, status, result, outputs, now, ttl, exit, replaces)
  redis.call('HDEL', job, 'lost_worker', 'lost_attempt', 'lost_until', 'verdict_seq')
  redis.call('HSET', job, 'status', status, 'result', result, 'finished_ms', now)
  for i, field in ipairs(OUT_FIELDS) do
    local output = outputs and outputs[i] or ''
    if output == '' then
      redis.call('HDEL', job, field)
    else
      redis.call('HSET', job, field, output)
    end
  end
  local seq
  if exit then
    seq = append_event(events, job, exit)
  else
    seq = append_entry(events, job, 'x', exit_event(status, replaces))
  end
  retire_job(job, events, stdin, id, now, ttl)
  return seq
end
local function give_up(job, worker, attempt, now, window, seq)
  redis.call('HSET', job, 'lost_worker', worker, 'lost_attempt', attempt,
    'lost_until', tonumber(now) + tonumber(window))
  if seq then
    redis.call('HSET', job, 'verdict_seq', seq)
  else
    redis.call('HDEL', job, 'verdict_seq')
  end
end
"#,
            $body
        )
    };
}

/// KEYS: queue, job, active set of the API key, idempotency key (or ""),
/// events stream, recent jobs list, the key's storage budget (hash), its
/// expiry schedule (sorted set).
/// ARGV: id, spec, api key name, language, now_ms (created), max depth,
/// per-key limit (0 = none), body hash, idempotency ttl (s), metadata, last
/// index of the recent jobs list kept, max attempts, bytes to reserve,
/// the key's storage budget (bytes), the idempotency record's budget entry.
/// Returns {outcome, detail}: accepted|existing|conflict (job id),
/// queue_full (depth), key_limit (active count), key_storage (bytes the
/// key holds).
///
/// Before the budget is checked, entries of the key whose keys have
/// expired (their expiry is past) are released, a bounded number per call.
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
local now = tonumber(ARGV[5])
local expired = redis.call('ZRANGEBYSCORE', KEYS[8], '-inf', now, 'LIMIT', 0, 1000)
for _, member in ipairs(expired) do
  local bytes = tonumber(redis.call('HGET', KEYS[7], member) or '0')
  redis.call('HDEL', KEYS[7], member)
  redis.call('HINCRBY', KEYS[7], 'total', -bytes)
  redis.call('ZREM', KEYS[8], member)
end
local held = tonumber(redis.call('HGET', KEYS[7], 'total') or '0')
local reserve = tonumber(ARGV[13])
local need = reserve
if KEYS[4] ~= '' then
  need = need + 256
end
if held + need > tonumber(ARGV[14]) then
  return {'key_storage', tostring(held)}
end
redis.call('HSET', KEYS[2], 'id', ARGV[1], 'spec', ARGV[2], 'api_key', ARGV[3],
  'language', ARGV[4], 'status', 'queued', 'attempts', 0, 'created_ms', ARGV[5],
  'active_key', KEYS[3], 'metadata', ARGV[10], 'max_attempts', ARGV[12],
  'stored_key', KEYS[7], 'expiry_key', KEYS[8])
redis.call('SADD', KEYS[3], ARGV[1])
redis.call('HSET', KEYS[7], 'j:' .. ARGV[1], reserve)
redis.call('ZADD', KEYS[8], '+inf', 'j:' .. ARGV[1])
redis.call('HINCRBY', KEYS[7], 'total', need)
append_event(KEYS[5], KEYS[2], '{"type":"status","status":"queued"}')
if KEYS[4] ~= '' then
  redis.call('HSET', KEYS[4], 'job', ARGV[1], 'hash', ARGV[8])
  redis.call('EXPIRE', KEYS[4], ARGV[9])
  redis.call('HSET', KEYS[7], ARGV[15], 256)
  redis.call('ZADD', KEYS[8], now + tonumber(ARGV[9]) * 1000, ARGV[15])
end
redis.call('LPUSH', KEYS[1], ARGV[1])
redis.call('LPUSH', KEYS[6], ARGV[1])
redis.call('LTRIM', KEYS[6], 0, tonumber(ARGV[11]))
return {'accepted', ARGV[1]}
"#
);

/// KEYS: job, the worker's processing list, events stream.
/// ARGV: id, worker id, now_ms, with spec (1|0), the worker's Docker host.
/// Returns {'start', spec (empty unless asked for), created_ms, attempts}
/// when the job was queued (it is now running on this worker: one more
/// attempt), else {'skip', status} and the id is dropped from the
/// processing list. A job no longer in this worker's processing list (a
/// reaper took it back while this worker stalled) is not started:
/// {'skip', 'not_claimed'}. A job this worker already started (a retried
/// start whose first reply was lost) stays claimed: {'skip', 'running'}.
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
redis.call('HSET', KEYS[1], 'status', 'running', 'worker', ARGV[2], 'started_ms', ARGV[3],
  'host', ARGV[5])
local attempts = redis.call('HINCRBY', KEYS[1], 'attempts', 1)
append_event(KEYS[3], KEYS[1], '{"type":"status","status":"running","worker":"' .. ARGV[2] .. '"}')
local spec = ''
if ARGV[4] == '1' then
  spec = redis.call('HGET', KEYS[1], 'spec')
end
return {'start', spec, redis.call('HGET', KEYS[1], 'created_ms'), tostring(attempts)}
"#
);

/// KEYS: job, the worker's processing list, events stream, stdin stream,
/// queue.
/// ARGV: id, status, result (without output), now_ms, ttl (s), worker id,
/// attempt, then the four outputs (compile stdout, compile stderr, run
/// stdout, run stderr; raw bytes).
/// - The worker's own running attempt: the result is recorded, every key of
///   the job set to expire, and only then the id dropped from the
///   processing list. Returns `finished`.
/// - An attempt the platform gave up on (a `worker_lost` or
///   `deadline_exceeded` verdict, or a retry) whose real result comes
///   within the late-result window, and is not itself an `error`: that
///   result wins. A verdict is replaced (the new `exit` says which `seq` it
///   replaces); a retry waiting in the queue is withdrawn; a retry running
///   elsewhere is cancelled. Returns `late`.
/// - Anything else (the job ended otherwise, or belongs to another attempt
///   now) is only dropped from the processing list: `stale:<status>`, or
///   `missing` when the job is gone.
pub const FINISH: &str = with_events!(
    r#"
local current = redis.call('HGET', KEYS[1], 'status')
if not current then
  redis.call('LREM', KEYS[2], 0, ARGV[1])
  return 'missing'
end
local outputs = {ARGV[8], ARGV[9], ARGV[10], ARGV[11]}
if current == 'running' and redis.call('HGET', KEYS[1], 'worker') == ARGV[6]
  and redis.call('HGET', KEYS[1], 'attempts') == ARGV[7] then
  settle_job(KEYS[1], KEYS[3], KEYS[4], ARGV[1], ARGV[2], ARGV[3], outputs, ARGV[4], ARGV[5], nil)
  redis.call('LREM', KEYS[2], 0, ARGV[1])
  return 'finished'
end
if ARGV[2] ~= 'error' and redis.call('HGET', KEYS[1], 'lost_worker') == ARGV[6]
  and redis.call('HGET', KEYS[1], 'lost_attempt') == ARGV[7]
  and tonumber(ARGV[4]) <= tonumber(redis.call('HGET', KEYS[1], 'lost_until') or '0') then
  local replaces = redis.call('HGET', KEYS[1], 'verdict_seq')
  if current == 'queued' then
    redis.call('LREM', KEYS[5], 0, ARGV[1])
  elseif current == 'running' then
    if redis.call('HGET', KEYS[1], 'cancel_requested') ~= '1' then
      redis.call('HSET', KEYS[1], 'cancel_requested', '1')
      redis.call('XADD', KEYS[4], '*', 'type', 'cancel')
    end
  end
  redis.call('HSET', KEYS[1], 'worker', ARGV[6])
  settle_job(KEYS[1], KEYS[3], KEYS[4], ARGV[1], ARGV[2], ARGV[3], outputs, ARGV[4], ARGV[5],
    nil, replaces)
  redis.call('LREM', KEYS[2], 0, ARGV[1])
  return 'late'
end
redis.call('LREM', KEYS[2], 0, ARGV[1])
return 'stale:' .. current
"#
);

/// KEYS: job, queue, stdin stream, events stream. ARGV: id, now_ms, ttl (s),
/// result of a job cancelled before it started.
/// A queued job is cancelled at once and never starts; a running one gets
/// `cancel_requested` and a `cancel` control message (once), which its
/// worker acts on; the stream is never trimmed, so nothing can push the
/// message out. Returns cancelled|requested|missing|finished:<terminal
/// status> (the prefix keeps a job that had already been cancelled apart
/// from one cancelled now).
pub const CANCEL: &str = with_events!(
    r#"
local status = redis.call('HGET', KEYS[1], 'status')
if not status then
  return 'missing'
end
if status == 'queued' then
  redis.call('LREM', KEYS[2], 0, ARGV[1])
  settle_job(KEYS[1], KEYS[4], KEYS[3], ARGV[1], 'cancelled', ARGV[4], nil, ARGV[2], ARGV[3], nil)
  return 'cancelled'
end
if status == 'running' then
  if redis.call('HGET', KEYS[1], 'cancel_requested') ~= '1' then
    redis.call('HSET', KEYS[1], 'cancel_requested', '1')
    redis.call('XADD', KEYS[3], '*', 'type', 'cancel')
  end
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

/// KEYS: the lost worker's processing list, its heartbeat, job, store,
/// dead-letter list, events stream, stdin stream.
/// ARGV: id, now_ms, ttl (s), most requeues, result of a running job whose
/// worker was lost, result of a queued job that ran out of requeues,
/// retry (1: allowed, the lost attempt's sandbox is known gone; 0: not
/// yet; never: settle it without a retry), the
/// late-result window (ms), result of a job cancelled while its worker was
/// lost, own (1|0: the worker itself, restarted under the same id, recovers
/// its list; its heartbeat lives), the lost worker's id.
/// Settles one job of a worker whose heartbeat expired, once: nothing
/// happens while the heartbeat lives (`alive`, unless `own`), and a job not
/// in the list is `absent` (another reaper settled it). Then, by status:
/// - `queued` (claimed, never started): back to the claim end of the store
///   while it has requeues left (`requeued`), else `error` and the
///   dead-letter list (`dead`);
/// - `running` on that worker: cancelled if a client asked for it
///   (`cancelled`); run again if it has attempts left (`max_attempts`) and
///   the retry is allowed (`retried`), or left in the list until it is
///   (`waiting`); else `error`/`worker_lost` (`worker_lost`). Either way the
///   lost attempt's real result can still win within the window;
/// - running elsewhere (`moved`), terminal (`terminal`) or gone (`missing`):
///   only dropped from the list.
///
/// Returns {outcome, detail}.
pub const REAP_JOB: &str = with_events!(
    r#"
if ARGV[10] ~= '1' and redis.call('EXISTS', KEYS[2]) == 1 then
  return {'alive', ''}
end
if not redis.call('LPOS', KEYS[1], ARGV[1]) then
  return {'absent', ''}
end
local status = redis.call('HGET', KEYS[3], 'status')
if not status then
  redis.call('LREM', KEYS[1], 0, ARGV[1])
  return {'missing', ''}
end
if status == 'queued' then
  redis.call('LREM', KEYS[1], 0, ARGV[1])
  local requeues = tonumber(redis.call('HGET', KEYS[3], 'requeues') or '0')
  if requeues < tonumber(ARGV[4]) then
    requeues = redis.call('HINCRBY', KEYS[3], 'requeues', 1)
    redis.call('RPUSH', KEYS[4], ARGV[1])
    return {'requeued', tostring(requeues)}
  end
  settle_job(KEYS[3], KEYS[6], KEYS[7], ARGV[1], 'error', ARGV[6], nil, ARGV[2], ARGV[3], nil)
  redis.call('LPUSH', KEYS[5], ARGV[1])
  redis.call('LTRIM', KEYS[5], 0, 9999)
  return {'dead', tostring(requeues)}
end
if status ~= 'running' then
  redis.call('LREM', KEYS[1], 0, ARGV[1])
  return {'terminal', status}
end
if redis.call('HGET', KEYS[3], 'worker') ~= ARGV[11] then
  redis.call('LREM', KEYS[1], 0, ARGV[1])
  return {'moved', ''}
end
local attempts = redis.call('HGET', KEYS[3], 'attempts') or '0'
if redis.call('HGET', KEYS[3], 'cancel_requested') == '1' then
  redis.call('LREM', KEYS[1], 0, ARGV[1])
  settle_job(KEYS[3], KEYS[6], KEYS[7], ARGV[1], 'cancelled', ARGV[9], nil, ARGV[2], ARGV[3], nil)
  return {'cancelled', ''}
end
if ARGV[7] ~= 'never' and tonumber(attempts) < tonumber(redis.call('HGET', KEYS[3], 'max_attempts') or '1') then
  if ARGV[7] ~= '1' then
    return {'waiting', attempts}
  end
  redis.call('LREM', KEYS[1], 0, ARGV[1])
  redis.call('HSET', KEYS[3], 'status', 'queued')
  redis.call('HDEL', KEYS[3], 'started_ms', 'host')
  give_up(KEYS[3], ARGV[11], attempts, ARGV[2], ARGV[8], nil)
  append_event(KEYS[6], KEYS[3], '{"type":"attempt","attempt":' .. (tonumber(attempts) + 1)
    .. ',"reason":"worker_lost","worker":"' .. ARGV[11] .. '"}')
  append_event(KEYS[6], KEYS[3], '{"type":"status","status":"queued"}')
  redis.call('RPUSH', KEYS[4], ARGV[1])
  return {'retried', attempts}
end
redis.call('LREM', KEYS[1], 0, ARGV[1])
local seq = settle_job(KEYS[3], KEYS[6], KEYS[7], ARGV[1], 'error', ARGV[5], nil, ARGV[2], ARGV[3],
  '{"type":"exit","status":"error","result":' .. ARGV[5] .. '}')
give_up(KEYS[3], ARGV[11], attempts, ARGV[2], ARGV[8], seq)
return {'worker_lost', attempts}
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
/// ARGV: id, worker id, started_ms, now_ms, ttl (s), result, the
/// late-result window (ms).
/// Settles a job that outlived its deadline on a worker that is alive but
/// silent about it: only if it is still the same run (running, on that
/// worker, started at that time). Like FINISH: result, expiry, out of the
/// active set and of the processing list. The worker's own real result, if
/// it comes within the window, replaces this verdict. Returns 1 if settled.
pub const SETTLE_STUCK: &str = with_events!(
    r#"
if redis.call('HGET', KEYS[1], 'status') ~= 'running'
  or redis.call('HGET', KEYS[1], 'worker') ~= ARGV[2]
  or redis.call('HGET', KEYS[1], 'started_ms') ~= ARGV[3] then
  return 0
end
local seq = settle_job(KEYS[1], KEYS[3], KEYS[4], ARGV[1], 'error', ARGV[6], nil, ARGV[4], ARGV[5],
  '{"type":"exit","status":"error","result":' .. ARGV[6] .. '}')
give_up(KEYS[1], ARGV[2], redis.call('HGET', KEYS[1], 'attempts') or '0', ARGV[4], ARGV[7], seq)
redis.call('LREM', KEYS[2], 0, ARGV[1])
return 1
"#
);

/// KEYS: job, events stream. ARGV: worker id, attempt, then pairs of
/// (kind, payload): kind `event` with an event's JSON (stages), or
/// `stdout`/`stderr` with raw output bytes.
/// Appends a running attempt's events; nothing once the job is terminal,
/// gone or another attempt's (so no event follows `exit`, and a lost
/// attempt's late output never mixes into a retry's). Output beyond
/// [`MAX_OUTPUT_EVENTS`] is left out. Counts the bytes for the job's
/// storage. Returns {'ended'} or {'ok', last seq (0 if nothing was
/// appended), output events left out}.
pub const APPEND_EVENTS: &str = with_events!(
    r#"
if redis.call('HGET', KEYS[1], 'status') ~= 'running'
  or redis.call('HGET', KEYS[1], 'worker') ~= ARGV[1]
  or redis.call('HGET', KEYS[1], 'attempts') ~= ARGV[2] then
  return {'ended'}
end
local seq = 0
local dropped = 0
local bytes = 0
local outputs = tonumber(redis.call('HGET', KEYS[1], 'out_events') or '0')
for i = 3, #ARGV, 2 do
  local kind, payload = ARGV[i], ARGV[i + 1]
  if kind == 'event' then
    seq = append_event(KEYS[2], KEYS[1], payload)
    bytes = bytes + #payload + 64
  elseif outputs < 4096 then
    seq = append_entry(KEYS[2], KEYS[1], 't', kind, 'd', payload)
    outputs = outputs + 1
    bytes = bytes + #payload + 64
  else
    dropped = dropped + 1
  end
end
redis.call('HSET', KEYS[1], 'out_events', outputs)
redis.call('HINCRBY', KEYS[1], 'event_bytes', bytes)
return {'ok', tostring(seq), tostring(dropped)}
"#
);

/// KEYS: job, stdin stream. ARGV: id, most stdin bytes a job may be sent,
/// bytes of stdin this message carries (0 for other messages), the
/// message's kind, most signals per job, most control messages per job,
/// the API key's storage budget (bytes), then the message's field/value
/// pairs.
/// Appends a control message from a stream client (stdin, stdin close, a
/// signal) for the job's worker, only while the job is queued or running,
/// so nothing is added to the stream of an ended job (its keys expire) and
/// no key is created for a gone one. Nothing trims the stream: each message
/// is counted instead — stdin bytes in `stdin_bytes`, signals in `signals`,
/// every message in `control_messages` — and its bytes count against the
/// API key's storage budget; a message over any budget is refused whole and
/// not counted, so signals can never crowd out a `cancel` or stdin.
/// Returns {sent, bytes used} | {over, bytes used} | {signals, count} |
/// {messages, count} | {storage, bytes the key holds} | {ended, status} |
/// {missing, ''}.
pub const SEND_INPUT: &str = r"
local status = redis.call('HGET', KEYS[1], 'status')
if not status then
  return {'missing', ''}
end
if status ~= 'queued' and status ~= 'running' then
  return {'ended', status}
end
local messages = tonumber(redis.call('HGET', KEYS[1], 'control_messages') or '0')
if messages >= tonumber(ARGV[6]) then
  return {'messages', tostring(messages)}
end
if ARGV[4] == 'signal' then
  local signals = tonumber(redis.call('HGET', KEYS[1], 'signals') or '0')
  if signals >= tonumber(ARGV[5]) then
    return {'signals', tostring(signals)}
  end
end
local used = tonumber(redis.call('HGET', KEYS[1], 'stdin_bytes') or '0')
local bytes = tonumber(ARGV[3])
if bytes > 0 and used + bytes > tonumber(ARGV[2]) then
  return {'over', tostring(used)}
end
local cost = bytes + 64
local stored = redis.call('HGET', KEYS[1], 'stored_key')
if stored then
  local held = tonumber(redis.call('HGET', stored, 'total') or '0')
  if held + cost > tonumber(ARGV[7]) then
    return {'storage', tostring(held)}
  end
  redis.call('HINCRBY', stored, 'total', cost)
  redis.call('HINCRBY', stored, 'j:' .. ARGV[1], cost)
end
if bytes > 0 then
  used = redis.call('HINCRBY', KEYS[1], 'stdin_bytes', bytes)
end
if ARGV[4] == 'signal' then
  redis.call('HINCRBY', KEYS[1], 'signals', 1)
end
redis.call('HINCRBY', KEYS[1], 'control_messages', 1)
redis.call('HINCRBY', KEYS[1], 'control_bytes', cost)
local command = {'XADD', KEYS[2], '*'}
for i = 8, #ARGV do
  command[#command + 1] = ARGV[i]
end
redis.call(unpack(command))
return {'sent', tostring(used)}
";

#[cfg(test)]
mod tests {
    use super::*;

    /// The Lua literals repeat the constants (a script cannot read Rust);
    /// this keeps them the same.
    #[test]
    fn the_scripts_use_the_documented_constants() {
        assert!(SUBMIT.contains(&format!("need + {IDEMPOTENCY_BYTES}")));
        assert!(SUBMIT.contains(&format!("'HSET', KEYS[7], ARGV[15], {IDEMPOTENCY_BYTES}")));
        assert!(FINISH.contains(&format!("local actual = {JOB_OVERHEAD} +")));
        assert!(APPEND_EVENTS.contains(&format!("outputs < {MAX_OUTPUT_EVENTS}")));
        assert!(APPEND_EVENTS.contains(&format!("#payload + {EVENT_OVERHEAD}")));
        assert!(SEND_INPUT.contains(&format!("bytes + {EVENT_OVERHEAD}")));
    }
}
