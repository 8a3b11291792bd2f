-- sched_lease(op, holder, ttl ms): the lease that elects the one daemon that schedules
-- applications. KEYS[1] is `allot:{allot-apps}:lease`, a hash: holder, expires (ms on Redis's
-- clock) and fencing, which goes up at every new term (a holder taking a lease that was not its
-- own running lease) and never down. Every write of the scheduler carries its fencing number;
-- one that is not the lease's current number is refused.
--   acquire: take the lease if it is free, lapsed or already ours (renewing it): answers
--            { 'mine', holder, fencing, ttl, now } or { 'held', holder, fencing, ms left, now }.
--   release: end our lease at once (a clean shutdown hands over without waiting for the TTL).
--   clock:   change nothing; answers { 'clock', holder, fencing, 0, now } (a daemon that opens).
-- `now` is Redis's clock: the daemon's scheduler decides by it, never by its own wall clock.
local now = now_ms()
local op, me, ttl = ARGV[1], ARGV[2], tonumber(ARGV[3])
local l = redis.call('HMGET', KEYS[1], 'holder', 'expires', 'fencing', 'fencing_by')
local holder, expires, fencing = l[1], tonumber(l[2] or '0'), tonumber(l[3] or '0')
local running = holder ~= false and expires > now
if op == 'acquire' then
  if running and holder ~= me then return { 'held', holder, fencing, expires - now, now } end
  -- A primary that did not give the lease's last term (a replica promoted, which may lack the
  -- terms given after its last copy, or a restart) starts a new term above every one before it
  -- (`fresh_floor`, as fencing numbers): a deposed scheduler whose term the failover lost has its
  -- writes refused, instead of sharing its number with the next scheduler.
  local moved, by
  fencing, moved, by = carried_on(fencing, l[4])
  if moved or not running then fencing = fencing + 1 end
  redis.call('HSET', KEYS[1], 'holder', me, 'expires', now + ttl, 'fencing', int(fencing), 'fencing_by', by)
  return { 'mine', me, fencing, ttl, now }
elseif op == 'clock' then
  return { 'clock', holder or '', fencing, 0, now }
elseif op == 'release' then
  if running and holder == me then redis.call('HSET', KEYS[1], 'expires', 0) end
  return { 'released', me, fencing, 0, now }
end
return redis.error_reply('unknown lease operation ' .. tostring(op))
