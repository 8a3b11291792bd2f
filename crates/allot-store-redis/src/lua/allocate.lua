-- allocate(request..., wait_ms): grants, refuses or queues a request [Flyte AllocateResource].
-- Replies: {'granted', existing, record, expires_in, now} | {'refused', level, cap, held, position,
-- units_ahead} | {'queued', waiter, position, units_ahead} | {'err', code, ...}.
local now = now_ms()
local r = req_from_argv(1)
local ns = redis.call('HMGET', K_NS, 'quota', 'granted', 'blocked', 'waiting_units', 'fencing', 'fencing_by',
  'fencing_skipped')
if not ns[1] then return NOT_FOUND end
local quota, granted, blocked = tonumber(ns[1]), tonumber(ns[2] or '0'), ns[3] == '1'
-- No units wait, so no waiter: the queue need not be looked at.
local queue_empty = tonumber(ns[4] or '0') == 0
local wait_ms = tonumber(ARGV[11])
local existing = redis.call('HGET', K_GRANTS, r.token)
if existing then
  local g = dec_grant(existing)
  local c = conflict(g, r, false)
  if c then return { 'err', 'token_conflict', 'held', c[1], c[2], c[3] } end
  return { 'granted', 1, existing, grant_expires_in(g, now), now }
end
-- A request larger than the quota is not refused outright: the quota may be raised (a quota of
-- 0 is a paused namespace). It is exhausted, or waits, like any other.
if r.kind == 's' and (redis.call('ZSCORE', K_CLOSED, r.session) or session_deadline(r.session, r.sdl) <= now) then
  return { 'err', 'session_not_found', r.session }
end
-- The counters do not change until this call decides: the caps are checked once, and the
-- counters read here are the ones a grant adds to.
local held_p, held_s = scope_held(r)
local counts = { granted = granted, fencing = tonumber(ns[5] or '0'), fencing_by = ns[6],
  skipped = tonumber(ns[7] or '0'), held_p = held_p, held_s = held_s }
local refusal = cap_refusal(r, counts)
-- A cap smaller than the request can never be met: answer at once, even when waiting.
if refusal and (r.units > refusal[2] or wait_ms == 0) then
  count_refusal(refusal)
  return { 'refused', refusal[1], refusal[2], refusal[3], 0, 0 }
end
-- A token already in the queue keeps its place; the new call takes the waiter over.
local queued = not queue_empty and redis.call('HGET', K_WTOK, r.token)
if queued then
  local w = dec_req(redis.call('HGET', K_WREQ, queued))
  local c = conflict(w, r, true)
  if c then return { 'err', 'token_conflict', 'waiting', c[1], c[2], c[3] } end
  local position, units_ahead = place_of(redis.call('ZRANK', K_QUEUE, queued))
  if wait_ms == 0 then
    local level, cap, held = 'exhausted', 0, 0
    if refusal then level, cap, held = refusal[1], refusal[2], refusal[3] end
    return { 'refused', level, cap, held, position, units_ahead }
  end
  local wid = int(redis.call('INCR', K_WSEQ))
  w.until_ = now + wait_ms
  w.sdl = math.max(w.sdl, r.sdl)
  redis.call('ZADD', K_QUEUE, redis.call('ZSCORE', K_QUEUE, queued), wid)
  redis.call('ZREM', K_QUEUE, queued)
  redis.call('HDEL', K_WREQ, queued)
  redis.call('ZREM', K_WDL, queued)
  redis.call('HSET', K_WREQ, wid, enc_req(w))
  redis.call('HSET', K_WTOK, r.token, wid)
  redis.call('ZADD', K_WDL, w.until_, wid)
  if w.kind == 's' then redis.call('ZADD', K_LEASES, 'GT', w.sdl, 's\n' .. w.session) end
  return { 'queued', wid, position, units_ahead }
end
if not refusal and (blocked or granted + r.units > quota) then
  refusal = 'exhausted'
end
if refusal then
  if wait_ms == 0 then
    if refusal == 'exhausted' then
      count_refusal(nil)
      return { 'refused', 'exhausted', 0, 0, 0, 0 }
    end
    count_refusal(refusal)
    return { 'refused', refusal[1], refusal[2], refusal[3], 0, 0 }
  end
  local seq = redis.call('INCR', K_WSEQ)
  local wid = int(seq)
  local position, units_ahead = place_of(redis.call('ZCARD', K_QUEUE))
  if refusal == 'exhausted' then redis.call('HSET', K_NS, 'blocked', 1) end
  r.since = now
  r.until_ = now + wait_ms
  redis.call('ZADD', K_QUEUE, seq, wid)
  redis.call('HSET', K_WREQ, wid, enc_req(r))
  redis.call('HSET', K_WTOK, r.token, wid)
  redis.call('ZADD', K_WDL, r.until_, wid)
  redis.call('HINCRBY', K_NS, 'waiting_units', r.units)
  -- A waiter under a session keeps the session's deadline here as a grant does: its keepalives
  -- renew it (`session_extend`), and the sweep answers the waiter when the session expires.
  if r.kind == 's' then redis.call('ZADD', K_LEASES, 'GT', r.sdl, 's\n' .. r.session) end
  emit('waiter.queued', r.token)
  return { 'queued', wid, position, units_ahead }
end
local record = insert_grant(r, now, counts)
local expires_in = -1
if r.kind == 't' then expires_in = r.ttl elseif r.kind == 's' then expires_in = math.max(0, session_deadline(r.session, r.sdl) - now) end
return { 'granted', 0, record, expires_in, now }
