-- release(token, fencing): idempotent [Flyte ReleaseResource]. Replies {'released', record, now}
-- | {'none'} | {'err', ...}.
local now = now_ms()
if redis.call('EXISTS', K_NS) == 0 then return NOT_FOUND end
local token, fencing = ARGV[1], ARGV[2]
local record = redis.call('HGET', K_GRANTS, token)
if not record then return { 'none' } end
local stale = check_fencing(dec_grant(record), fencing)
if stale then return stale end
remove_grant(token)
redis.call('HINCRBY', K_NS, 'stat_released', 1)
local woken = {}
admit(now, woken)
publish(woken)
return { 'released', record, now }
