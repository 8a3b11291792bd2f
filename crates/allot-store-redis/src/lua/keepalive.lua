-- keepalive(token, fencing): restarts a TTL grant's lease. A session grant is renewed through its
-- session. Replies {'grant', record, expires_in, now} | {'err', ...}.
local now = now_ms()
if redis.call('EXISTS', K_NS) == 0 then return NOT_FOUND end
local token, fencing = ARGV[1], ARGV[2]
local record = redis.call('HGET', K_GRANTS, token)
if not record then return { 'err', 'grant_not_found' } end
local g = dec_grant(record)
local stale = check_fencing(g, fencing)
if stale then return stale end
if g.kind == 't' then
  g.deadline = now + g.ttl
  record = enc_grant(g)
  redis.call('HSET', K_GRANTS, token, record)
  redis.call('ZADD', K_LEASES, g.deadline, 'g\n' .. token)
  emit_grant('grant.renewed', token, nil, record, now)
end
return { 'grant', record, grant_expires_in(g, now), now }
