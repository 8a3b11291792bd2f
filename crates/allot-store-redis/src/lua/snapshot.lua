-- snapshot(op, ...): reads one slot's state whole for a snapshot, and writes it back at a restore
-- (see `snapshot.rs`). KEYS[1] is the slot's prefix: a namespace's `allot:{<namespace>}`, a
-- pool's `allot:pool:{<pool>}`, or `allot:{allot-sessions}`, `allot:{allot-runs}`,
-- `allot:{allot-access}`, `allot:{allot-apps}`, `allot:{allot-feed}`. Each read is one call, so
-- what it answers is the slot as it was at one moment. A restore writes no event: the restored
-- log starts after them (`feed_load`).
--
--   now(): { now }
--   ns_dump(): { now, 1, quota, fencing, token, record, ... } | { now, 0, retired fencing or '' }
--   ns_load(quota, fencing): creates the namespace with no grant, its last fencing number given
--     `fencing`, noted as given by this primary. { 1 } | { 0 } if it exists
--   grants_load(token, record, ...): adds grants (records as `enc_grant`'s) with their leases and
--     counters. A session grant's lease is the session's, written by `session_lease`. { n }
--   session_lease(session, deadline): the deadline this namespace knows for a session. { 1 }
--   retired_load(fencing): the fencing counter of a namespace that does not exist. { 1 }
--   sessions_dump(): { now, id, ttl, deadline, owner, ... }
--   sessions_load(id, ttl, deadline, owner, namespace...): a session, and the namespaces where
--     it holds grants. { 1 } | { 0 } if it exists
--   pool_dump(): { now, pool hash, allocs hash, ended hash } (hashes as flat lists; an empty
--     pool hash: no pool)
--   pool_load(field, value, ...): creates the pool hash. { 1 } | { 0 } if it exists
--   allocs_load(id, record, ...): live allocs (leased unless held) and ended ones. { n }
--   hash_dump(suffix, ...): { hash, ... } the named hashes of the slot, as flat lists
--   hash_load(suffix, field, value, ...): sets fields of the hash KEYS[1]:suffix. { n }
--   runs_load(app, task, record, ...): runs, in their applications' sets. { n }
--   catalog_load(key, record, at, ...): kept outputs, indexed by when they were kept. { n }
--   indexed(flag...): sets the slot's flags that say an index was built (`runs.lua`). { 1 }
--   access_moved(): moves the access version, so every daemon reads the records again. { 1 }
--   feed_load(revision): the log gives revisions after `revision` (after its last one if that
--     is higher: revisions never go back), and keeps nothing before. { rev }
local op = ARGV[1]
local K = KEYS[1]

if op == 'now' then
  return { now_ms() }
elseif op == 'ns_dump' then
  bind(KEYS, ARGV)
  local now = now_ms()
  local v = redis.call('HMGET', K_NS, 'quota', 'fencing')
  if not v[1] then return { now, 0, redis.call('GET', K_FENCING) or '' } end
  local reply = { now, 1, v[1], v[2] or '0' }
  local all = redis.call('HGETALL', K_GRANTS)
  for i = 1, #all do reply[#reply + 1] = all[i] end
  return reply
elseif op == 'ns_load' then
  bind(KEYS, ARGV)
  if redis.call('EXISTS', K_NS) == 1 then return { 0 } end
  local fencing = ARGV[3]
  redis.call('HSET', K_NS, 'quota', ARGV[2], 'granted', 0, 'fencing', fencing, 'fencing_base', fencing,
    'fencing_by', replication_id())
  redis.call('DEL', K_FENCING, K_FENCING .. '_by')
  return { 1 }
elseif op == 'grants_load' then
  bind(KEYS, ARGV)
  local n = 0
  for i = 2, #ARGV, 2 do
    local token, record = ARGV[i], ARGV[i + 1]
    local g = dec_grant(record)
    redis.call('HSET', K_GRANTS, token, record)
    add_units(g, 1, false)
    if g.kind == 't' then
      redis.call('ZADD', K_LEASES, g.deadline, 'g\n' .. token)
    elseif g.kind == 's' then
      redis.call('SADD', P .. ':sg:' .. g.session, token)
    end
    n = n + 1
  end
  return { n }
elseif op == 'session_lease' then
  bind(KEYS, ARGV)
  redis.call('ZADD', K_LEASES, ARGV[3], 's\n' .. ARGV[2])
  return { 1 }
elseif op == 'retired_load' then
  bind(KEYS, ARGV)
  redis.call('SET', K_FENCING, ARGV[2])
  redis.call('SET', K_FENCING .. '_by', replication_id())
  return { 1 }
elseif op == 'sessions_dump' then
  local reply = { now_ms() }
  for _, id in ipairs(redis.call('ZRANGE', K .. ':index', 0, -1)) do
    local v = redis.call('HMGET', K .. ':s:' .. id, 'ttl', 'deadline', 'owner')
    if v[1] then
      reply[#reply + 1] = id
      reply[#reply + 1] = v[1]
      reply[#reply + 1] = v[2]
      reply[#reply + 1] = v[3] or ''
    end
  end
  return reply
elseif op == 'sessions_load' then
  local id, ttl, deadline, owner = ARGV[2], ARGV[3], ARGV[4], ARGV[5]
  if redis.call('EXISTS', K .. ':s:' .. id) == 1 then return { 0 } end
  redis.call('HSET', K .. ':s:' .. id, 'ttl', ttl, 'deadline', deadline)
  if owner ~= '' then redis.call('HSET', K .. ':s:' .. id, 'owner', owner) end
  redis.call('ZADD', K .. ':index', deadline, id)
  for i = 6, #ARGV do redis.call('SADD', K .. ':n:' .. id, ARGV[i]) end
  return { 1 }
elseif op == 'pool_dump' then
  return { now_ms(), redis.call('HGETALL', K .. ':pool'), redis.call('HGETALL', K .. ':allocs'),
    redis.call('HGETALL', K .. ':ended') }
elseif op == 'pool_load' then
  if redis.call('EXISTS', K .. ':pool') == 1 then return { 0 } end
  local fields = { 'HSET', K .. ':pool' }
  for i = 2, #ARGV do fields[#fields + 1] = ARGV[i] end
  redis.call(unpack(fields))
  return { 1 }
elseif op == 'allocs_load' then
  local n = 0
  for i = 2, #ARGV, 2 do
    local id, record = ARGV[i], ARGV[i + 1]
    local a = cjson.decode(record)
    if a.ea then
      redis.call('HSET', K .. ':ended', id, record)
      redis.call('ZADD', K .. ':endings', a.ea, id)
    else
      redis.call('HSET', K .. ':allocs', id, record)
      redis.call('ZADD', K .. ':leases', a.e, id)
    end
    n = n + 1
  end
  return { n }
elseif op == 'hash_dump' then
  local reply = {}
  for i = 2, #ARGV do reply[#reply + 1] = redis.call('HGETALL', K .. ':' .. ARGV[i]) end
  return reply
elseif op == 'hash_load' then
  local fields = { 'HSET', K .. ':' .. ARGV[2] }
  for i = 3, #ARGV do fields[#fields + 1] = ARGV[i] end
  if #fields > 2 then redis.call(unpack(fields)) end
  return { (#fields - 2) / 2 }
elseif op == 'runs_load' then
  local n = 0
  for i = 2, #ARGV, 3 do
    redis.call('HSET', K .. ':runs', ARGV[i] .. '/' .. ARGV[i + 1], ARGV[i + 2])
    redis.call('SADD', K .. ':app-runs:' .. ARGV[i], ARGV[i + 1])
    n = n + 1
  end
  return { n }
elseif op == 'catalog_load' then
  local n = 0
  for i = 2, #ARGV, 3 do
    redis.call('HSET', K .. ':catalog', ARGV[i], ARGV[i + 1])
    redis.call('ZADD', K .. ':catalog-at', ARGV[i + 2], ARGV[i])
    n = n + 1
  end
  return { n }
elseif op == 'indexed' then
  for i = 2, #ARGV do redis.call('SET', K .. ':' .. ARGV[i], '1') end
  return { 1 }
elseif op == 'access_moved' then
  local version, _, by = carried_on(tonumber(redis.call('GET', K .. ':version') or '0'), redis.call('GET', K .. ':version_by'))
  redis.call('SET', K .. ':version', int(version + 1))
  redis.call('SET', K .. ':version_by', by)
  return { 1 }
elseif op == 'feed_load' then
  local meta = K .. ':meta'
  local rev = math.max(tonumber(ARGV[2]), tonumber(redis.call('HGET', meta, 'rev') or '0'))
  redis.call('DEL', K .. ':log', K .. ':cursors')
  redis.call('HSET', meta, 'rev', int(rev), 'rev_by', replication_id(), 'compacted', int(rev))
  return { rev }
end
return redis.error_reply('unknown snapshot operation ' .. tostring(op))
