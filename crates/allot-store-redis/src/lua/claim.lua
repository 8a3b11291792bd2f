-- claim(waiter, cancel, why, token): the answer of a queued allocate call of `token`. With cancel = 1 a waiter still in
-- the queue leaves it (its wait ended, or its caller went away: `why`, `timed_out` or
-- `caller_left`) and gets its place. Replies: {'granted', record,
-- expires_in, now} | {'error', fields...} | {'waiting'} | {'refused', level, cap, held, position,
-- units_ahead} | {'gone'} (a newer call with the same token took over, or it was dropped).
-- A waiter id names the caller's waiter only if its token is the caller's: a failover or restart
-- that lost the last writes gives the ids it lost again, to other callers' waiters, whose answers
-- and places are not the caller's to take ({'gone'}). (A daemon of an earlier version gives no
-- token: not checked.)
local now = now_ms()
local wid, cancel, token = ARGV[1], ARGV[2] == '1', ARGV[4]
local answer = redis.call('HGET', K_WOKEN, wid)
if answer and token and string.sub(answer, 1, 2) == 'g\n' and string.sub(answer, 3) ~= token then
  return { 'gone' }
end
if answer then
  redis.call('HDEL', K_WOKEN, wid)
  redis.call('ZREM', K_WDL, wid)
  local f = split(answer)
  if f[1] == 'g' then
    local record = redis.call('HGET', K_GRANTS, f[2])
    -- Released or expired before its caller came for it: the grant was real but is over.
    if not record then return { 'gone' } end
    return { 'granted', record, grant_expires_in(dec_grant(record), now), now }
  end
  table.remove(f, 1)
  table.insert(f, 1, 'error')
  return f
end
local rank = redis.call('ZRANK', K_QUEUE, wid)
if not rank then return { 'gone' } end
local r = dec_req(redis.call('HGET', K_WREQ, wid))
if token and r.token ~= token then return { 'gone' } end
if not cancel then return { 'waiting' } end
local position, units_ahead = place_of(rank)
forget_waiter(wid, r)
redis.call('ZREM', K_WDL, wid)
emit('waiter.gave_up', r.token, ARGV[3] or 'timed_out')
local refusal = cap_refusal(r)
count_refusal(refusal)
-- The waiter may have held up the ones behind it.
local woken = {}
admit(now, woken)
publish(woken)
if refusal then return { 'refused', refusal[1], refusal[2], refusal[3], position, units_ahead } end
return { 'refused', 'exhausted', 0, 0, position, units_ahead }
