-- sweep(): ends the leases that are due, drops abandoned waiters and unclaimed answers, and admits
-- waiters into what was freed. Replies {expired, next deadline in ms from now or -1}.
local now = now_ms()
if redis.call('EXISTS', K_NS) == 0 then
  -- A removed namespace's answers (namespace_not_found) stay for their callers to claim until
  -- they expire (`remove_namespace` sets when; a key of an earlier version gets it here).
  if redis.call('PTTL', K_WOKEN) == -1 then redis.call('PEXPIRE', K_WOKEN, 2 * GRACE_MS) end
  redis.call('DEL', K_WDL)
  return { 0, -1 }
end
local expired = 0
local sessions_ended = false
for _, member in ipairs(redis.call('ZRANGEBYSCORE', K_LEASES, '-inf', now, 'LIMIT', 0, 256)) do
  redis.call('ZREM', K_LEASES, member)
  local kind, name = string.sub(member, 1, 1), string.sub(member, 3)
  if kind == 'g' then
    if remove_grant(name, nil, 'expired') then expired = expired + 1 end
  else
    local set = P .. ':sg:' .. name
    for _, token in ipairs(redis.call('SMEMBERS', set)) do
      if remove_grant(token, nil, 'session_expired') then expired = expired + 1 end
    end
    redis.call('DEL', set)
    -- Its waiters here, answered by the admission below (the session's deadline has passed).
    if redis.call('ZCARD', K_QUEUE) > 0 then sessions_ended = true end
  end
end
if expired > 0 then redis.call('HINCRBY', K_NS, 'stat_expired', expired) end
redis.call('ZREMRANGEBYSCORE', K_CLOSED, '-inf', now)
-- Waiters whose caller should long have claimed or cancelled them: its daemon is gone.
local changed = expired > 0 or sessions_ended
for _, wid in ipairs(redis.call('ZRANGEBYSCORE', K_WDL, '-inf', now - GRACE_MS, 'LIMIT', 0, 256)) do
  redis.call('ZREM', K_WDL, wid)
  redis.call('HDEL', K_WOKEN, wid)
  local record = redis.call('HGET', K_WREQ, wid)
  if record then
    local r = dec_req(record)
    forget_waiter(wid, r)
    emit('waiter.gave_up', r.token, 'caller_left')
    changed = true
  end
end
local woken = {}
if changed then admit(now, woken) end
publish(woken)
local next_due = redis.call('ZRANGE', K_LEASES, 0, 0, 'WITHSCORES')
local next_in = -1
if next_due[2] then next_in = math.max(0, tonumber(next_due[2]) - now) end
return { expired, next_in }
