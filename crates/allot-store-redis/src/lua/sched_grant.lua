-- sched_grant(op, fencing, token, units): the grants of the scheduler's placements (no lease;
-- they end when their task does). Each call carries the scheduler's fencing number; P:sched_fence
-- keeps the highest seen (it outlives the namespace), and an older term is refused, so a deposed
-- scheduler changes nothing here once its successor has touched the namespace.
--   take: grants `units` to `token` if they fit the quota now without going ahead of a waiter;
--         a token already granted is a retry. {'granted', record} | {'refused'} | {'err', ...}
--   drop: releases `token` (idempotent). {'released'} | {'none'}
local op, token = ARGV[1], ARGV[3]
local fencing = tonumber(ARGV[2])
local seen = tonumber(redis.call('GET', P .. ':sched_fence') or '0')
if fencing < seen then return { 'err', 'deposed', seen } end
if fencing > seen then redis.call('SET', P .. ':sched_fence', fencing) end
if op == 'take' then
  local ns = redis.call('HMGET', K_NS, 'quota', 'granted', 'blocked')
  if not ns[1] then return NOT_FOUND end
  local existing = redis.call('HGET', K_GRANTS, token)
  if existing then return { 'granted', existing } end
  local units = tonumber(ARGV[4])
  if ns[3] == '1' or tonumber(ns[2] or '0') + units > tonumber(ns[1]) then return { 'refused' } end
  local r = { token = token, units = units, project = '', scope = '', kind = 'n', ttl = 0, session = '', sdl = 0 }
  return { 'granted', insert_grant(r, now_ms(), nil) }
elseif op == 'drop' then
  local record = redis.call('HGET', K_GRANTS, token)
  if not record then return { 'none' } end
  release_grant(token, record)
  return { 'released' }
end
return redis.error_reply('unknown sched_grant operation ' .. tostring(op))
