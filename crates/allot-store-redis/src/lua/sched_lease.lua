-- sched_lease(op, holder, ttl ms): the lease that elects the one daemon that schedules
-- applications. KEYS[1] is `allot:{allot-apps}:lease`, a hash: holder, expires (ms on Redis's
-- clock) and fencing, which goes up at every new term (a holder taking a lease that was not its
-- own running lease) and never down. Every write of the scheduler carries its fencing number;
-- one that is not the lease's current number is refused.
--   acquire: take the lease if it is free, lapsed or already ours (renewing it): answers
--            { 'mine', holder, fencing, ttl, now } or { 'held', holder, fencing, ms left, now }.
--   release: end our lease at once (a clean shutdown hands over without waiting for the TTL).
--   clock:   change nothing; answers { 'clock', holder, fencing, 0, now } (a daemon that opens).
--   restore: take the lease for a restore, only if no daemon holds it or asked for it within
--            its TTL: answers as acquire does (`held` naming such a daemon, and how long until
--            it counts as gone).
-- Every daemon asks for the lease (acquire) every half second or so, whether it gets it or
-- not: `<lease>:daemons`, a sorted set of the askers by when their ask lapses, says which
-- daemons use this Redis. A release takes the asker out.
-- `now` is Redis's clock: the daemon's scheduler decides by it, never by its own wall clock.
local now = now_ms()
local op, me, ttl = ARGV[1], ARGV[2], tonumber(ARGV[3])
local DAEMONS = KEYS[1] .. ':daemons'
local l = redis.call('HMGET', KEYS[1], 'holder', 'expires', 'fencing', 'fencing_by')
local holder, expires, fencing = l[1], tonumber(l[2] or '0'), tonumber(l[3] or '0')
local running = holder ~= false and expires > now
local function take()
  -- A primary that did not give the lease's last term (a replica promoted, which may lack the
  -- terms given after its last copy, or a restart) starts a new term above every one before it
  -- (`fresh_floor`, as fencing numbers): a deposed scheduler whose term the failover lost has its
  -- writes refused, instead of sharing its number with the next scheduler.
  local moved, by
  fencing, moved, by = carried_on(fencing, l[4])
  if moved or not running then fencing = fencing + 1 end
  redis.call('HSET', KEYS[1], 'holder', me, 'expires', now + ttl, 'fencing', int(fencing), 'fencing_by', by)
  return { 'mine', me, fencing, ttl, now }
end
if op == 'acquire' then
  redis.call('ZREMRANGEBYSCORE', DAEMONS, '-inf', now)
  redis.call('ZADD', DAEMONS, now + ttl, me)
  if running and holder ~= me then return { 'held', holder, fencing, expires - now, now } end
  return take()
elseif op == 'restore' then
  redis.call('ZREMRANGEBYSCORE', DAEMONS, '-inf', now)
  if running and holder ~= me then return { 'held', holder, fencing, expires - now, now } end
  local askers = redis.call('ZRANGE', DAEMONS, 0, -1, 'WITHSCORES')
  for i = 1, #askers, 2 do
    if askers[i] ~= me then return { 'held', askers[i], fencing, tonumber(askers[i + 1]) - now, now } end
  end
  return take()
elseif op == 'clock' then
  return { 'clock', holder or '', fencing, 0, now }
elseif op == 'release' then
  redis.call('ZREM', DAEMONS, me)
  if running and holder == me then redis.call('HSET', KEYS[1], 'expires', 0) end
  return { 'released', me, fencing, 0, now }
end
return redis.error_reply('unknown lease operation ' .. tostring(op))
