-- Sessions. KEYS[1] is the prefix `allot:{allot-sessions}`; all sessions share its hash slot.
--   S:index    zset session -> deadline (ms of Redis time)
--   S:s:<id>   hash ttl, deadline, owner (the user that opened it; absent when unknown)
--   S:n:<id>   set of the namespaces where the session has held grants
-- ARGV[1] is the operation; a session is alive while its deadline is ahead.
local S = KEYS[1]
local K_INDEX = S .. ':index'
local now = now_ms()
local op, id = ARGV[1], ARGV[2]
local function key(id_) return S .. ':s:' .. id_ end
local function nskey(id_) return S .. ':n:' .. id_ end
local function drop(id_)
  redis.call('ZREM', K_INDEX, id_)
  redis.call('DEL', key(id_), nskey(id_))
end
-- {ttl, deadline, owner ('' when unknown)} of a live session, or nil.
local function load(id_)
  local v = redis.call('HMGET', key(id_), 'ttl', 'deadline', 'owner')
  if not v[1] or tonumber(v[2]) <= now then return nil end
  return { tonumber(v[1]), tonumber(v[2]), v[3] or '' }
end
local function reply(s)
  local r = { now, s[1], s[2], s[3] }
  for _, name in ipairs(redis.call('SMEMBERS', nskey(id))) do r[#r + 1] = name end
  return r
end

if op == 'open' then
  -- ARGV[3] the TTL, ARGV[4] the owner ('' when unknown).
  local ttl = tonumber(ARGV[3])
  local owner = ARGV[4] or ''
  if redis.call('EXISTS', key(id)) == 1 then return { 'exists' } end
  redis.call('HSET', key(id), 'ttl', ARGV[3], 'deadline', int(now + ttl))
  if owner ~= '' then redis.call('HSET', key(id), 'owner', owner) end
  redis.call('ZADD', K_INDEX, now + ttl, id)
  emit('session.opened', id, nil, int(ttl) .. '\n' .. int(now + ttl) .. '\n' .. owner)
  return { now, ttl, now + ttl }
elseif op == 'touch' then
  -- An allocate under this session in namespace ARGV[3]: {now, ttl, deadline, owner} or {}.
  local s = load(id)
  if not s then return {} end
  redis.call('SADD', nskey(id), ARGV[3])
  return { now, s[1], s[2], s[3] }
elseif op == 'keepalive' then
  local s = load(id)
  if not s then return {} end
  s[2] = now + s[1]
  redis.call('HSET', key(id), 'deadline', int(s[2]))
  redis.call('ZADD', K_INDEX, s[2], id)
  emit('session.renewed', id, nil, int(s[1]) .. '\n' .. int(s[2]) .. '\n' .. s[3])
  return reply(s)
elseif op == 'close' then
  local s = load(id)
  if not s then return {} end
  local r = reply(s)
  drop(id)
  emit('session.closed', id)
  return r
elseif op == 'get' then
  local s = load(id)
  if not s then return {} end
  return reply(s)
elseif op == 'list' then
  local r = { now }
  for _, sid in ipairs(redis.call('ZRANGEBYSCORE', K_INDEX, '(' .. now, '+inf')) do
    local s = load(sid)
    if s then
      r[#r + 1] = sid
      r[#r + 1] = s[1]
      r[#r + 1] = s[2]
      r[#r + 1] = s[3]
    end
  end
  return r
elseif op == 'sweep' then
  -- The grants of an expired session end by themselves in each namespace, at the same deadline.
  local due = redis.call('ZRANGEBYSCORE', K_INDEX, '-inf', now, 'LIMIT', 0, 256)
  for _, sid in ipairs(due) do
    drop(sid)
    emit('session.expired', sid)
  end
  return { #due }
end
return redis.error_reply('unknown session operation ' .. tostring(op))
