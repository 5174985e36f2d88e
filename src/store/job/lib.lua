-- The helpers every step's script shares (see script.rs for what comes
-- before this: STEP and MOVES). Numbers the Rust side names as constants
-- (EVENT_OVERHEAD, JOB_OVERHEAD, MAX_OUTPUT_EVENTS, IDEMPOTENCY_BYTES) are
-- defined here once; a test keeps them equal.
local EVENT_OVERHEAD = 64
local JOB_OVERHEAD = 4096
local MAX_OUTPUT_EVENTS = 4096
local IDEMPOTENCY_BYTES = 256
-- What `jobs:queue` holds: one turn per queued job (a claim takes a turn,
-- then the job whose turn it is; see claim.lua).
local TURN = 'turn'
local OUT_FIELDS = {'out:compile:stdout', 'out:compile:stderr', 'out:run:stdout', 'out:run:stderr'}

-- Whether this step may move `job` to status `to` (MOVES); and the status
-- it has now ('-': no job).
local function may_become(job, to)
  local from = redis.call('HGET', job, 'status') or '-'
  local allowed = MOVES[STEP][from]
  return (allowed ~= nil and allowed[to] == true), from
end

-- The only write of a job's status: moves `job` to `to` if MOVES allows
-- it for this step, else writes nothing and returns false and the status
-- it has. A script calls it before any other write of the same branch.
local function set_status(job, to)
  local ok, from = may_become(job, to)
  if ok then
    redis.call('HSET', job, 'status', to)
  end
  return ok, from
end

-- The reply of a step whose move the table refused.
local function refused(from, to)
  return {'refused', from, to}
end

-- Numbers the event with the job's next `seq` (a counter in the job hash)
-- and adds it with the stream id `<seq>-0`, so clients resume by `seq`;
-- any fields (raw output, an exit to be completed with the stored result).
local function append_entry(stream, job, ...)
  local seq = redis.call('HINCRBY', job, 'event_seq', 1)
  redis.call('XADD', stream, seq .. '-0', ...)
  return seq
end

local function append_event(stream, job, event)
  return append_entry(stream, job, 'event', event)
end

-- Appends a running attempt's batch of events: ARGV from `first` on, in
-- pairs of (kind, payload), kind `event` with an event's JSON (stages) or
-- `stdout`/`stderr` with raw output bytes. Output beyond MAX_OUTPUT_EVENTS
-- is left out; the bytes count for the job's storage. Returns the last seq
-- appended (0 if none) and how many output events were left out.
local function append_batch(stream, job, first)
  local seq = 0
  local dropped = 0
  local bytes = 0
  local outputs = tonumber(redis.call('HGET', job, 'out_events') or '0')
  for i = first, #ARGV, 2 do
    local kind, payload = ARGV[i], ARGV[i + 1]
    if kind == 'event' then
      seq = append_event(stream, job, payload)
      bytes = bytes + #payload + EVENT_OVERHEAD
    elseif outputs < MAX_OUTPUT_EVENTS then
      seq = append_entry(stream, job, 't', kind, 'd', payload)
      outputs = outputs + 1
      bytes = bytes + #payload + EVENT_OVERHEAD
    else
      dropped = dropped + 1
    end
  end
  redis.call('HSET', job, 'out_events', outputs)
  redis.call('HINCRBY', job, 'event_bytes', bytes)
  return seq, dropped
end

-- The stored form of the `exit` event (the readers put the result in).
local function exit_event(status, replaces)
  local event = '{"type":"exit","status":"' .. status .. '"'
  if replaces then
    event = event .. ',"replaces":' .. replaces
  end
  return event .. '}'
end

-- Puts queued job `id` in its user's queue and a turn in `queue`: at the
-- back of its user's queue (a new job), or at the claim end (`first`: a
-- job given back, which had its turn). A user whose queue was empty joins
-- its key's ring, and a key whose ring was empty joins `tenants`, at the
-- back (or the front, for `first`). A job stored before fair turns (no
-- `user_queue`) goes into `queue` itself, as then.
local function enqueue(job, id, first, queue, tenants)
  local user_queue = redis.call('HGET', job, 'user_queue')
  if not user_queue then
    if first then
      redis.call('RPUSH', queue, id)
    else
      redis.call('LPUSH', queue, id)
    end
    return
  end
  local users = redis.call('HGET', job, 'users_ring')
  local push = first and 'LPUSH' or 'RPUSH'
  if first then
    redis.call('RPUSH', user_queue, id)
  else
    redis.call('LPUSH', user_queue, id)
  end
  if redis.call('LLEN', user_queue) == 1 then
    redis.call(push, users, user_queue)
    if redis.call('LLEN', users) == 1 then
      redis.call(push, tenants, users)
    end
  end
  if first then
    redis.call('RPUSH', queue, TURN)
  else
    redis.call('LPUSH', queue, TURN)
  end
end

-- Takes queued job `id` out of its user's queue (and its turn out of
-- `queue`); a user or key left with nothing queued leaves its ring. A
-- claimed job is in no user queue (its turn was taken): nothing changes.
local function withdraw(job, id, queue, tenants, turns)
  local user_queue = redis.call('HGET', job, 'user_queue')
  if not user_queue then
    redis.call('LREM', queue, 0, id)
    return
  end
  if redis.call('LREM', user_queue, 0, id) == 0 then
    return
  end
  if redis.call('LLEN', user_queue) == 0 then
    local users = redis.call('HGET', job, 'users_ring')
    redis.call('LREM', users, 0, user_queue)
    if redis.call('LLEN', users) == 0 then
      redis.call('LREM', tenants, 0, users)
      redis.call('HDEL', turns, users)
    end
  end
  redis.call('LREM', queue, 1, TURN)
end

-- The run history (store/history.rs reads it). At submit, with `summary`
-- (the job's summary hash), `key_history` and `user_history` (the sorted
-- sets of its key and of its user, '' for the key's anonymous user) and
-- `window_ms`: lists the job in both sets by its created_ms, trims them to
-- the window (which is also their expiry and the summary's) and writes
-- the summary. Then, and at every status change after it (called with the
-- job alone), copies the job's status, times, the result's error reason
-- (else its run stage's reason) and its stages' cpu_ms and wall_ms into
-- the summary, while the summary lives.
-- The CPU and wall time a result used: its compile and run stages', and
-- each test's of a graded job, its checker program's (`checker`) and the
-- compiles of the new sandboxes its tests went on in (`restarts`).
local function result_usage(decoded)
  local cpu, wall = 0, 0
  local parts = {decoded.compile, decoded.run, decoded.checker, decoded.restarts}
  if type(decoded.tests) == 'table' then
    for _, test in ipairs(decoded.tests) do
      parts[#parts + 1] = test
    end
  end
  for _, part in pairs(parts) do
    if type(part) == 'table' then
      cpu = cpu + (tonumber(part.cpu_ms) or 0)
      wall = wall + (tonumber(part.wall_ms) or 0)
    end
  end
  return cpu, wall
end

local function note_history(job, summary, key_history, user_history, window_ms)
  if summary then
    local id, created, language, user = unpack(redis.call('HMGET', job, 'id', 'created_ms', 'language', 'user'))
    local window = tonumber(window_ms)
    redis.call('HSET', job, 'summary_key', summary)
    redis.call('HSET', summary, 'language', language, 'user', user or '', 'created_ms', created)
    redis.call('PEXPIRE', summary, window)
    for _, set in ipairs({key_history, user_history}) do
      if set ~= '' then
        redis.call('ZADD', set, created, id)
        redis.call('ZREMRANGEBYSCORE', set, '-inf', '(' .. (tonumber(created) - window))
        redis.call('PEXPIRE', set, window)
      end
    end
  end
  summary = redis.call('HGET', job, 'summary_key')
  if not summary or redis.call('EXISTS', summary) == 0 then
    return
  end
  local status, started, finished, result = unpack(redis.call('HMGET', job, 'status', 'started_ms', 'finished_ms', 'result'))
  local fields = {status = status, started_ms = started, finished_ms = finished}
  local ok, decoded = pcall(cjson.decode, result or '')
  if ok and type(decoded) == 'table' then
    local run = decoded.run
    if type(decoded.reason) == 'string' then
      fields.reason = decoded.reason
    elseif type(run) == 'table' and type(run.reason) == 'string' then
      fields.reason = run.reason
    end
    if type(decoded.compile) == 'table' or type(decoded.run) == 'table' or type(decoded.tests) == 'table' then
      fields.cpu_ms, fields.wall_ms = result_usage(decoded)
    end
  end
  for _, name in ipairs({'status', 'started_ms', 'finished_ms', 'reason', 'cpu_ms', 'wall_ms'}) do
    if fields[name] then
      redis.call('HSET', summary, name, tostring(fields[name]))
    else
      redis.call('HDEL', summary, name)
    end
  end
end

-- Sets the job's entry in its key's storage budget to its actual size.
local function account(job, id, expires_ms)
  local stored = redis.call('HGET', job, 'stored_key')
  if not stored then
    return
  end
  local actual = JOB_OVERHEAD + redis.call('HSTRLEN', job, 'spec') + redis.call('HSTRLEN', job, 'result')
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

-- Takes an ended job out of its API key's active set, sets its keys to
-- expire and accounts its size until then.
local function expire_job(job, events, stdin, id, now, ttl)
  local active = redis.call('HGET', job, 'active_key')
  if active and redis.call('SREM', active, id) == 1 then
    local user_active = redis.call('HGET', job, 'user_active_key')
    if user_active then
      local user = redis.call('HGET', job, 'user') or ''
      if redis.call('HINCRBY', user_active, user, -1) <= 0 then
        redis.call('HDEL', user_active, user)
      end
    end
  end
  redis.call('EXPIRE', job, ttl)
  redis.call('EXPIRE', events, ttl)
  redis.call('EXPIRE', stdin, ttl)
  account(job, id, tonumber(now) + tonumber(ttl) * 1000)
end

-- The usage ledger (store/usage.rs): one hash per API key and UTC day,
-- the key's totals under each figure's name and a user's under
-- `<figure>:<user>`.
local USAGE_FIGURES = {'jobs', 'cpu_ms', 'wall_ms', 'output_bytes'}

-- The UTC date of Unix time `ms`, `YYYY-MM-DD` (Howard Hinnant's
-- civil_from_days, as Day in usage.rs).
local function usage_day(ms)
  local z = math.floor(tonumber(ms) / 86400000) + 719468
  local era = math.floor(z / 146097)
  local doe = z - era * 146097
  local yoe = math.floor((doe - math.floor(doe / 1460) + math.floor(doe / 36524)
    - math.floor(doe / 146096)) / 365)
  local doy = doe - (365 * yoe + math.floor(yoe / 4) - math.floor(yoe / 100))
  local mp = math.floor((5 * doy + 2) / 153)
  local day = doy - math.floor((153 * mp + 2) / 5) + 1
  local month = mp < 10 and mp + 3 or mp - 9
  local year = yoe + era * 400
  if month <= 2 then
    year = year + 1
  end
  return string.format('%04d-%02d-%02d', year, month, day)
end

-- When the ledger of the day of `ms` expires: `ttl` seconds after the day.
local function usage_until(ms, ttl)
  return (math.floor(tonumber(ms) / 86400000) + 1) * 86400 + tonumber(ttl)
end

-- The submit's check of the key's daily quotas against today's `ledger`
-- (each quota '' when the key has none): nil, or the refusal's reply
-- {'quota_exceeded', option, used}.
local function over_quota(ledger, user, key_cpu_s, user_cpu_s, user_jobs)
  local function used(field)
    return tonumber(redis.call('HGET', ledger, field) or '0')
  end
  if key_cpu_s ~= '' and used('cpu_ms') >= tonumber(key_cpu_s) * 1000 then
    return {'quota_exceeded', 'cpu_seconds_per_day', tostring(used('cpu_ms'))}
  end
  if user_cpu_s ~= '' and used('cpu_ms:' .. user) >= tonumber(user_cpu_s) * 1000 then
    return {'quota_exceeded', 'user_cpu_seconds_per_day', tostring(used('cpu_ms:' .. user))}
  end
  if user_jobs ~= '' and used('submitted:' .. user) >= tonumber(user_jobs) then
    return {'quota_exceeded', 'user_jobs_per_day', tostring(used('submitted:' .. user))}
  end
  return nil
end

-- An accepted submit: counted in today's `ledger` (what the jobs quota
-- counts), and the job told where its usage goes when it ends.
local function count_submission(job, ledger, prefix, user, now, ttl)
  redis.call('HINCRBY', ledger, 'submitted', 1)
  redis.call('HINCRBY', ledger, 'submitted:' .. user, 1)
  redis.call('EXPIREAT', ledger, usage_until(now, ttl))
  redis.call('HSET', job, 'usage_key', prefix, 'usage_ttl', ttl)
end

-- Adds an ended job's usage to its key's and its user's ledger of the day
-- it ended, once: what was counted is kept in the job (`counted_*`), and
-- a settle of a job already counted (a late result replacing a verdict)
-- adds only the difference, to the day it was first counted. A job that
-- never started used nothing and is not counted. Figures: the sums of
-- the result's stages' (and tests') `cpu_ms` and `wall_ms`, and the output it keeps.
local function count_usage(job, result, now)
  local prefix = redis.call('HGET', job, 'usage_key')
  if not prefix or tonumber(redis.call('HGET', job, 'attempts') or '0') == 0 then
    return
  end
  local figures = {jobs = 1, cpu_ms = 0, wall_ms = 0, output_bytes = 0}
  local ok, decoded = pcall(cjson.decode, result)
  if ok and type(decoded) == 'table' then
    figures.cpu_ms, figures.wall_ms = result_usage(decoded)
  end

  for _, field in ipairs(OUT_FIELDS) do
    figures.output_bytes = figures.output_bytes + redis.call('HSTRLEN', job, field)
  end
  local ledger = redis.call('HGET', job, 'counted_in')
  local expires = redis.call('HGET', job, 'counted_until')
  if not ledger then
    ledger = prefix .. usage_day(now)
    expires = usage_until(now, redis.call('HGET', job, 'usage_ttl') or '0')
    redis.call('HSET', job, 'counted_in', ledger, 'counted_until', expires)
  end
  local user = redis.call('HGET', job, 'user') or ''
  for _, name in ipairs(USAGE_FIGURES) do
    local counted = 'counted_' .. name
    local delta = figures[name] - tonumber(redis.call('HGET', job, counted) or '0')
    if delta ~= 0 then
      redis.call('HINCRBY', ledger, name, delta)
      redis.call('HINCRBY', ledger, name .. ':' .. user, delta)
    end
    redis.call('HSET', job, counted, figures[name])
  end
  redis.call('EXPIREAT', ledger, expires)
end

-- Settles a job: its terminal status, result and raw output, the `exit`
-- event (stored with `exit`'s JSON when given, else to be completed with
-- the stored result, saying which `seq` it `replaces` when it does), its
-- usage in the ledger (count_usage), then expire_job. Every path that
-- ends a job goes through it. It clears the late-result record; a
-- verdict sets it again right after (give_up).
-- The attempt's last events (ARGV from `tail` on, as append_batch takes
-- them), when given, go before the exit event.
-- Returns the exit event's seq, or nil and the job's status when the
-- table refuses the move (nothing is written then).
local function settle_job(job, events, stdin, id, status, result, outputs, now, ttl, exit, replaces, tail)
  local ok, from = set_status(job, status)
  if not ok then
    return nil, from
  end
  if tail then
    append_batch(events, job, tail)
  end
  redis.call('HDEL', job, 'lost_worker', 'lost_attempt', 'lost_until', 'verdict_seq')
  redis.call('HSET', job, 'result', result, 'finished_ms', now)
  for i, field in ipairs(OUT_FIELDS) do
    local output = outputs and outputs[i] or ''
    if output == '' then
      redis.call('HDEL', job, field)
    else
      redis.call('HSET', job, field, output)
    end
  end
  note_history(job)
  count_usage(job, result, now)
  local seq
  if exit then
    seq = append_event(events, job, exit)
  else
    seq = append_entry(events, job, 'x', exit_event(status, replaces))
  end
  expire_job(job, events, stdin, id, now, ttl)
  return seq
end

-- Records that the platform gave up on `worker`'s `attempt`, so its real
-- result, if it still comes within the window, can win.
local function give_up(job, worker, attempt, now, window, seq)
  redis.call('HSET', job, 'lost_worker', worker, 'lost_attempt', attempt,
    'lost_until', tonumber(now) + tonumber(window))
  if seq then
    redis.call('HSET', job, 'verdict_seq', seq)
  else
    redis.call('HDEL', job, 'verdict_seq')
  end
end

-- Settles a running job with the platform's `error` verdict `result`
-- (carried by its own exit event, since a late real result may replace
-- the job's) and records that it gave up on `worker`'s `attempt`. Returns
-- nil and the job's status when the table refuses the move.
local function settle_verdict(job, events, stdin, id, result, now, ttl, worker, attempt, window)
  local seq, from = settle_job(job, events, stdin, id, 'error', result, nil, now, ttl,
    '{"type":"exit","status":"error","result":' .. result .. '}')
  if not seq then
    return nil, from
  end
  give_up(job, worker, attempt, now, window, seq)
  return seq
end

