-- PLACES (reads only): where each of the given jobs stands in the fair
-- order `claim.lua` takes jobs in, as the number of claims before its own
-- (0: it is next). KEYS: tenants, tenant_turns, tenant_weights, claims,
-- then one job key per job; ARGV: the jobs' ids, in the same order.
-- Replies {claims, place, ...}: the claims counter, then per job its place,
-- or -1 when it is not queued (started, ended, gone, or stored before fair
-- turns).
--
-- Within a key the users take one claim each in ring order from its front;
-- a job with `ahead` older jobs of its own user is claimed in its user's
-- round `ahead`, so each other user of the key claims min(its jobs, ahead)
-- before it, one more when it is ahead in the ring. Across keys, the ring
-- of keys is visited in turn, each key for `weight` claims (the front for
-- what is left of its turns), until the key has made those claims.
local tenants_key, turns_key, weights_key, claims_key = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local claims = tonumber(redis.call('GET', claims_key) or '0')
local rings = redis.call('LRANGE', tenants_key, 0, -1)
local ring_index = {}
local weights = {}
for i, ring in ipairs(rings) do
  ring_index[ring] = i
  weights[i] = math.max(1, tonumber(redis.call('HGET', weights_key, ring) or '1'))
end
local front_left = 0
if rings[1] then
  front_left = math.max(1, weights[1] - tonumber(redis.call('HGET', turns_key, rings[1]) or '0'))
end

-- A key's users (their queues, front first) and how many jobs each has.
local loaded = {}
local function users_of(ring)
  local users = loaded[ring]
  if users then
    return users
  end
  users = {queues = redis.call('LRANGE', ring, 0, -1), lens = {}, total = 0}
  for i, queue in ipairs(users.queues) do
    users.lens[i] = redis.call('LLEN', queue)
    users.total = users.total + users.lens[i]
  end
  loaded[ring] = users
  return users
end

-- Claims of the job's own key before it.
local function within_key(ring, user_queue, ahead)
  local users = users_of(ring)
  local mine
  for i, queue in ipairs(users.queues) do
    if queue == user_queue then
      mine = i
    end
  end
  if not mine then
    return nil
  end
  local before = ahead
  for i, len in ipairs(users.lens) do
    if i ~= mine then
      local rounds = ahead
      if i < mine then
        rounds = rounds + 1
      end
      before = before + math.min(len, rounds)
    end
  end
  return before
end

-- Claims of every key before the key's claim number `before` + 1.
local function across_keys(k, before)
  local left = {}
  for i, ring in ipairs(rings) do
    left[i] = users_of(ring).total
  end
  local place, taken = 0, 0
  local visit, turns = 1, front_left
  while true do
    if visit == k then
      if taken + turns > before then
        return place + (before - taken)
      end
      place = place + turns
      taken = taken + turns
    else
      local take = math.min(turns, left[visit])
      place = place + take
      left[visit] = left[visit] - take
    end
    visit = visit % #rings + 1
    turns = weights[visit]
  end
end

local out = {claims}
for n = 5, #KEYS do
  local id = ARGV[n - 4]
  local fields = redis.call('HMGET', KEYS[n], 'status', 'user_queue', 'users_ring')
  local status, user_queue, ring = fields[1], fields[2], fields[3]
  local place = -1
  if status == 'queued' and user_queue and ring and ring_index[ring] then
    local index = redis.call('LPOS', user_queue, id)
    if index then
      -- New jobs go in on the left, claims take from the right.
      local ahead = redis.call('LLEN', user_queue) - 1 - index
      local before = within_key(ring, user_queue, ahead)
      if before then
        place = across_keys(ring_index[ring], before)
      end
    end
  end
  out[#out + 1] = place
end
return out
