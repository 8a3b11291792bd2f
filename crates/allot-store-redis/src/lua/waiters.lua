-- waiters(after or '', limit): up to `limit` waiters that arrived after arrival number `after`, in
-- queue order (P:queue is scored by arrival number, which a waiter keeps when a retry takes it
-- over). Replies {now, waiters ahead, their units, waiter, arrival, record, blocked_by_cap, ...}
-- | {'err', ...}: the first waiter's place follows from the waiters ahead of it.
local now = now_ms()
if redis.call('EXISTS', K_NS) == 0 then return NOT_FOUND end
local after = ARGV[1]
local ahead, units_ahead = 0, 0
if after ~= '' then
  for _, wid in ipairs(redis.call('ZRANGEBYSCORE', K_QUEUE, '-inf', after)) do
    local record = redis.call('HGET', K_WREQ, wid)
    if record then
      ahead = ahead + 1
      units_ahead = units_ahead + dec_req(record).units
    end
  end
end
local reply = { now, ahead, units_ahead }
local from = after == '' and '-inf' or '(' .. after
local page = redis.call('ZRANGEBYSCORE', K_QUEUE, from, '+inf', 'WITHSCORES', 'LIMIT', 0, tonumber(ARGV[2]))
for i = 1, #page, 2 do
  local wid = page[i]
  local record = redis.call('HGET', K_WREQ, wid)
  if record then
    local refusal = cap_refusal(dec_req(record))
    reply[#reply + 1] = wid
    reply[#reply + 1] = page[i + 1]
    reply[#reply + 1] = record
    reply[#reply + 1] = refusal and refusal[1] or ''
  end
end
return reply
