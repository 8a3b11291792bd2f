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
release_grant(token, record)
return { 'released', record }
