-- FORGET_WORKER: forgets a dead worker whose processing list is empty:
-- out of the set, its list deleted. Returns forgotten | alive (the
-- heartbeat is back) | busy (the list still holds ids) | absent (not in
-- the set: another reaper forgot it first).
local workers_key, heartbeat_key, processing_key = KEYS[1], KEYS[2], KEYS[3]
local worker = ARGV[1]
if redis.call('EXISTS', heartbeat_key) == 1 then
  return 'alive'
end
if redis.call('LLEN', processing_key) > 0 then
  return 'busy'
end
if redis.call('SREM', workers_key, worker) == 0 then
  return 'absent'
end
redis.call('DEL', processing_key)
return 'forgotten'
