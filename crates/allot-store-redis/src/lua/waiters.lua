-- waiters(): the queue in order. Replies {now, waiter, record, blocked_by_cap, ...} | {'err', ...}.
local now = now_ms()
if redis.call('EXISTS', K_NS) == 0 then return NOT_FOUND end
local reply = { now }
for _, wid in ipairs(redis.call('ZRANGE', K_QUEUE, 0, -1)) do
  local record = redis.call('HGET', K_WREQ, wid)
  if record then
    local refusal = cap_refusal(dec_req(record))
    reply[#reply + 1] = wid
    reply[#reply + 1] = record
    reply[#reply + 1] = refusal and refusal[1] or ''
  end
end
return reply
