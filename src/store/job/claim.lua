-- CLAIM: the second half of a claim. The worker's BLMOVE moved a turn from
-- jobs:queue to its processing list; this puts the job whose turn it is in
-- the turn's place, in one step: the key at the front of `tenants` (which
-- keeps the front for `weight` claims in a row), and within that key the
-- user at the front of its ring (users take one claim each, in turn); the
-- oldest job of that user. Replies {'claimed', id} | {'spare'} (no job
-- waits: the turn was one a cancel could not take back; dropped) |
-- {'none'} (no turn in the list). Each claim counts in `claims` (the claim
-- rate queued jobs' waits are estimated from, `places.lua`).
if redis.call('LREM', processing_key, 1, TURN) == 0 then
  return {'none'}
end
local users = redis.call('LINDEX', tenants_key, 0)
while users do
  local user_queue = redis.call('LINDEX', users, 0)
  if not user_queue then
    -- A key with no user left waiting: out of the ring.
    redis.call('LPOP', tenants_key)
    redis.call('HDEL', tenant_turns_key, users)
  else
    local id = redis.call('RPOP', user_queue)
    if not id then
      redis.call('LPOP', users)
    else
      if redis.call('LLEN', user_queue) == 0 then
        redis.call('LPOP', users)
      else
        redis.call('LMOVE', users, users, 'LEFT', 'RIGHT')
      end
      if redis.call('LLEN', users) == 0 then
        redis.call('LPOP', tenants_key)
        redis.call('HDEL', tenant_turns_key, users)
      else
        local used = redis.call('HINCRBY', tenant_turns_key, users, 1)
        if used >= tonumber(redis.call('HGET', tenant_weights_key, users) or '1') then
          redis.call('HDEL', tenant_turns_key, users)
          redis.call('LMOVE', tenants_key, tenants_key, 'LEFT', 'RIGHT')
        end
      end
      redis.call('LPUSH', processing_key, id)
      redis.call('INCR', claims_key)
      return {'claimed', id}
    end
  end
  users = redis.call('LINDEX', tenants_key, 0)
end
return {'spare'}
