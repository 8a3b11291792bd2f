-- release(token, fencing): idempotent [Flyte ReleaseResource]. Replies {'released', record}
-- | {'none'} | {'err', ...}.
local token, fencing = ARGV[1], ARGV[2]
local record = redis.call('HGET', K_GRANTS, token)
if not record then
  if redis.call('EXISTS', K_NS) == 0 then return NOT_FOUND end
  return { 'none' }
end
local stale = check_fencing(dec_grant(record), fencing)
if stale then return stale end
remove_grant(token, record)
if redis.call('ZCARD', K_QUEUE) > 0 then
  local woken = {}
  admit(now_ms(), woken)
  publish(woken)
end
return { 'released', record }
