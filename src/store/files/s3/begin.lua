-- BEGIN: before a file's bytes are uploaded. Replies {'existed'} when the
-- key has the file already (its time renewed: nothing to upload),
-- {'over_budget', held} when its known size would take the key over its
-- budget, else {'upload'}, with the new object registered in the objects'
-- set for `grace_ms`: should the upload never be committed, its bytes go.
sweep_storage(stored_key, expiry_key, now)
if redis.call('EXISTS', meta_key) == 1 and redis.call('HEXISTS', stored_key, member) == 1 then
  redis.call('PEXPIRE', meta_key, keep_ms)
  redis.call('ZADD', expiry_key, now + keep_ms, member)
  redis.call('ZADD', objects_key, now + keep_ms, redis.call('GET', meta_key))
  return {'existed'}
end
if size >= 0 then
  local held = tonumber(redis.call('HGET', stored_key, 'total') or '0')
    - tonumber(redis.call('HGET', stored_key, member) or '0')
  if held + size > budget then
    return {'over_budget', tostring(held)}
  end
end
redis.call('ZADD', objects_key, now + grace_ms, object)
return {'upload'}
