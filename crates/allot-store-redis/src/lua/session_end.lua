-- session_end(session, deadline): a closed session's grants here end, and its waiters here are
-- answered session_not_found. Until `deadline` the session is refused here. Replies {released}.
local now = now_ms()
if redis.call('EXISTS', K_NS) == 0 then return { 0 } end
local session = ARGV[1]
redis.call('ZADD', K_CLOSED, ARGV[2], session)
local set = P .. ':sg:' .. session
local released = 0
for _, token in ipairs(redis.call('SMEMBERS', set)) do
  if remove_grant(token, nil, 'session_closed') then released = released + 1 end
end
redis.call('DEL', set)
redis.call('ZREM', K_LEASES, 's\n' .. session)
local woken = {}
for _, wid in ipairs(redis.call('ZRANGE', K_QUEUE, 0, -1)) do
  local record = redis.call('HGET', K_WREQ, wid)
  if record then
    local r = dec_req(record)
    if r.kind == 's' and r.session == session then
      forget_waiter(wid, r)
      answer_waiter(wid, 'x\nsession\n' .. session, woken)
      emit('waiter.gave_up', r.token, 'session_ended')
    end
  end
end
admit(now, woken)
publish(woken)
return { released }
