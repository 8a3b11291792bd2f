-- pool(op, args...): leased resource pools [Reflow `pool`], one function for every operation of
-- one pool. KEYS[1] is the pool's prefix `allot:pool:{<pool>}`:
--   Q:pool      hash: capacity, stopped (0/1), stat_accepted, stat_offer_expired, stat_freed,
--               stat_reclaimed, labels (a JSON object), occupied (held by things allot does not
--               manage: never offered), cordon_since and drain_at (ms; absent when not
--               cordoned, not drained), spared (the room the scheduler holds for preemptors:
--               never offered, and left free by every alloc but the scheduler's own); the pool
--               exists iff this key does
--   Q:allocs    hash alloc id -> live alloc (JSON: r resources, o owner, l labels, c created,
--               k last keepalive or 0, e expires, m its owner's metadata as JSON text, kept as
--               a string so that cjson never rewrites it)
--   Q:leases    zset alloc id -> expires
--   Q:ended     hash alloc id -> ended alloc (the same JSON plus ea ended at, er reason)
--   Q:endings   zset alloc id -> ended at
-- Resources are `name units frac` items joined by `,` (frac = milli-units below one unit), read
-- into exact two-limb integers (see `parse`). Times are ms of Redis's TIME.
--
-- Invariant: the resources of the live allocs (lapsed or not) never exceed the capacity less what
-- is occupied when an alloc is made; lapsed allocs are offered and reclaimed, most-expired first,
-- only as needed. A cordoned pool makes no offer and no alloc.
local Q = KEYS[1]
local K_POOL, K_ALLOCS, K_LEASES, K_ENDED, K_ENDINGS = Q .. ':pool', Q .. ':allocs', Q .. ':leases', Q .. ':ended',
  Q .. ':endings'
local op = ARGV[1]
local now = now_ms()

-- In Lua a quantity is { high, low } milli-units: high counts LIMB (10^12) milli-units, low the
-- rest, so every sum stays an exact integer in Lua's doubles (a quantity may reach 2^64
-- milli-units, past the 2^53 a double holds exactly). The text keeps `units frac`.
local LIMB = 1e12
-- Units in the low limb: LIMB / 1000.
local LOW_UNITS_DIGITS = 9

local function parse(text)
  local r = {}
  if text == nil or text == '' then return r end
  for item in string.gmatch(text, '[^,]+') do
    local name, u, f = string.match(item, '^(%S+) (%d+) (%d+)$')
    -- The units' digits are split as text, never read whole into a double.
    local high, low = 0, u
    if #u > LOW_UNITS_DIGITS then
      high, low = tonumber(string.sub(u, 1, #u - LOW_UNITS_DIGITS)), string.sub(u, #u - LOW_UNITS_DIGITS + 1)
    end
    r[name] = { high, tonumber(low) * 1000 + tonumber(f) }
  end
  return r
end

local function format(r)
  local names = {}
  for name, v in pairs(r) do
    if v[1] > 0 or v[2] > 0 then names[#names + 1] = name end
  end
  table.sort(names)
  local items = {}
  for _, name in ipairs(names) do
    local high, low = r[name][1], r[name][2]
    local units = math.floor(low / 1000)
    local text = int(units)
    if high > 0 then text = int(high) .. string.format('%0' .. LOW_UNITS_DIGITS .. 'd', units) end
    items[#items + 1] = name .. ' ' .. text .. ' ' .. int(low % 1000)
  end
  return table.concat(items, ',')
end

local function less(a, b) return a[1] < b[1] or (a[1] == b[1] and a[2] < b[2]) end
local function get(r, name) return r[name] or { 0, 0 } end

local function add(a, b)
  local out = {}
  for name, v in pairs(a) do out[name] = { v[1], v[2] } end
  for name, v in pairs(b) do
    local x = get(out, name)
    local high, low = x[1] + v[1], x[2] + v[2]
    if low >= LIMB then high, low = high + 1, low - LIMB end
    out[name] = { high, low }
  end
  return out
end

-- a - b per resource, never below zero.
local function sub(a, b)
  local out = {}
  for name, v in pairs(a) do
    local y = get(b, name)
    if less(y, v) then
      local high, low = v[1] - y[1], v[2] - y[2]
      if low < 0 then high, low = high - 1, low + LIMB end
      out[name] = { high, low }
    end
  end
  return out
end

local function fits(have, want)
  for name, v in pairs(want) do
    if less(get(have, name), v) then return false end
  end
  return true
end

-- The per-resource minimum (a resource missing on either side is 0).
local function min(a, b)
  local out = {}
  for name, v in pairs(a) do
    local y = b[name]
    if y then out[name] = less(v, y) and { v[1], v[2] } or { y[1], y[2] } end
  end
  return out
end

local function is_empty(r) return format(r) == '' end

local function load_allocs()
  local allocs = {}
  local all = redis.call('HGETALL', K_ALLOCS)
  for i = 1, #all, 2 do
    local a = cjson.decode(all[i + 1])
    a.id = all[i]
    allocs[#allocs + 1] = a
  end
  return allocs
end

local function held(allocs, only_live)
  local sum = {}
  for _, a in ipairs(allocs) do
    if not only_live or a.e > now then sum = add(sum, parse(a.r)) end
  end
  return sum
end

local function encode_alloc(a)
  return cjson.encode({ r = a.r, o = a.o, l = a.l, c = a.c, k = a.k, e = a.e, ea = a.ea, er = a.er, h = a.h, m = a.m })
end

local function end_alloc(a, reason)
  redis.call('HDEL', K_ALLOCS, a.id)
  redis.call('ZREM', K_LEASES, a.id)
  a.ea, a.er = now, reason
  local record = encode_alloc(a)
  redis.call('HSET', K_ENDED, a.id, record)
  redis.call('ZADD', K_ENDINGS, now, a.id)
  -- At most 1,024 ended allocs per pool (MAX_ENDED_PER_POOL), the oldest go first.
  if redis.call('ZCARD', K_ENDINGS) > 1024 then
    local oldest = redis.call('ZPOPMIN', K_ENDINGS)
    if oldest[1] then redis.call('HDEL', K_ENDED, oldest[1]) end
  end
  if reason == 'freed' then redis.call('HINCRBY', K_POOL, 'stat_freed', 1) end
  if reason == 'reclaimed' then redis.call('HINCRBY', K_POOL, 'stat_reclaimed', 1) end
  emit('alloc.ended', a.id, reason, record)
  return record
end

-- What allocs may hold: the capacity less what is occupied.
local function usable()
  local p = redis.call('HMGET', K_POOL, 'capacity', 'occupied')
  return sub(parse(p[1]), parse(p[2] or ''))
end

local function cordoned() return redis.call('HEXISTS', K_POOL, 'cordon_since') == 1 end

-- The room the scheduler holds here for preemptors (set by `spare`).
local function spared() return parse(redis.call('HGET', K_POOL, 'spared') or '') end

local function view()
  local p = redis.call('HMGET', K_POOL, 'capacity', 'stopped', 'stat_accepted', 'stat_offer_expired', 'stat_freed',
    'stat_reclaimed', 'labels', 'occupied', 'cordon_since', 'drain_at')
  local allocs = load_allocs()
  local live, lapsed, n_lapsed = {}, {}, 0
  for _, a in ipairs(allocs) do
    if a.e > now then
      live = add(live, parse(a.r))
    else
      lapsed = add(lapsed, parse(a.r))
      n_lapsed = n_lapsed + 1
    end
  end
  return { 'pool', p[1], format(live), format(lapsed), #allocs, n_lapsed, tonumber(p[2] or '0'),
    tonumber(p[3] or '0'), tonumber(p[4] or '0'), tonumber(p[5] or '0'), tonumber(p[6] or '0'), p[7] or '{}',
    p[8] or '', p[9] or '', p[10] or '' }
end

-- The pool's event: its view after the change, its fields joined by newlines (labels are JSON,
-- which escapes newlines).
local function emit_pool()
  local v = view()
  table.remove(v, 1)
  for i = 1, #v do v[i] = tostring(v[i] or '') end
  emit('pool.put', '', nil, table.concat(v, '\n'))
end

local NOT_FOUND = { 'err', 'pool_not_found' }

-- A live alloc's record; or nil and the error to answer (it ended, or never was).
local function live_record(id)
  local record = redis.call('HGET', K_ALLOCS, id)
  if record then return record end
  local ended = redis.call('HGET', K_ENDED, id)
  if ended then return nil, { 'err', 'alloc_ended', cjson.decode(ended).er } end
  return nil, { 'err', 'alloc_not_found' }
end

-- The scheduler's fencing number on this pool (Q:pool `sched_fence`, the highest seen): a held
-- alloc made or ended in an older term is refused, so a deposed scheduler changes nothing here
-- once its successor has touched the pool. Answers the refusal, or nil (and raises the mark).
local function sched_fence(given)
  local fencing = tonumber(given or '0')
  local seen = tonumber(redis.call('HGET', K_POOL, 'sched_fence') or '0')
  if fencing < seen then return { 'err', 'deposed', seen } end
  if fencing > seen then redis.call('HSET', K_POOL, 'sched_fence', fencing) end
  return nil
end
-- The expiry of a held alloc: past any time (the year 5138), and 14 digits, so cjson writes it
-- as a whole number (the daemon reads `h` and takes it as `HELD`).
local HELD = 99999999999999

if op == 'put' then
  -- put(capacity, create_only): creates the pool or changes its capacity; starts a stopped pool.
  local created = redis.call('EXISTS', K_POOL) == 0
  if created or ARGV[3] ~= '1' then
    redis.call('HSET', K_POOL, 'capacity', ARGV[2], 'stopped', 0)
    emit_pool()
  end
  local v = view()
  v[1] = created and 1 or 0
  return v
end
if redis.call('EXISTS', K_POOL) == 0 then return NOT_FOUND end

if op == 'view' then
  return view()
elseif op == 'label' then
  -- label(labels JSON): replaces the pool's labels.
  redis.call('HSET', K_POOL, 'labels', ARGV[2])
  emit_pool()
  return view()
elseif op == 'remove' then
  local n = redis.call('HLEN', K_ALLOCS)
  if n > 0 and ARGV[2] ~= '1' then return { 'err', 'pool_in_use', n } end
  for _, a in ipairs(load_allocs()) do
    a.ea, a.er = now, 'pool_removed'
    emit('alloc.ended', a.id, 'pool_removed', encode_alloc(a))
  end
  redis.call('DEL', K_POOL, K_ALLOCS, K_LEASES, K_ENDED, K_ENDINGS)
  emit('pool.removed', '')
  return { 'removed', n }
elseif op == 'occupy' then
  -- occupy(resources): what things allot does not manage hold.
  redis.call('HSET', K_POOL, 'occupied', ARGV[2])
  emit_pool()
  return view()
elseif op == 'cordon' then
  -- cordon(order, grace ms): `cordon`, `drain` (cordoned, its tasks preempted at now + grace, or
  -- at an earlier drain's time) or `uncordon`.
  local order = ARGV[2]
  if order == 'uncordon' then
    redis.call('HDEL', K_POOL, 'cordon_since', 'drain_at')
  else
    if not cordoned() then redis.call('HSET', K_POOL, 'cordon_since', now) end
    if order == 'drain' then
      local at = now + tonumber(ARGV[3])
      local earlier = tonumber(redis.call('HGET', K_POOL, 'drain_at') or '')
      if earlier and earlier < at then at = earlier end
      redis.call('HSET', K_POOL, 'drain_at', at)
    end
  end
  emit_pool()
  -- Redis's clock follows the view, so the answer's times are told against it.
  local v = view()
  v[#v + 1] = now
  return v
elseif op == 'offer' then
  if redis.call('HGET', K_POOL, 'stopped') == '1' or cordoned() then return { 'offer', '' } end
  return { 'offer', format(sub(sub(usable(), held(load_allocs(), true)), spared())) }
elseif op == 'spare' then
  -- spare(resources ('' for none), fencing): the room the scheduler holds here for preemptors,
  -- in its term (fenced as its held allocs are).
  local deposed = sched_fence(ARGV[3])
  if deposed then return deposed end
  if ARGV[2] == '' then redis.call('HDEL', K_POOL, 'spared') else redis.call('HSET', K_POOL, 'spared', ARGV[2]) end
  return { 'spared' }
elseif op == 'accept' then
  -- accept(id, min, max (at least min: `AllocRequest::upper`), owner, labels JSON, initial lease ms,
  -- held, fencing, metadata ('' for none)): with held = '1', an alloc the scheduler holds for a task: no lease (`h`, and an expiry
  -- past any time, so the sweeper never reaches it) until the task ends (`end_held`).
  -- A held accept carries the scheduler's fencing number (ARGV[9]); it is idempotent (the
  -- scheduler names the id, and a retry finds its alloc).
  local id, want_min = ARGV[2], parse(ARGV[3])
  local want_max = ARGV[4] ~= '' and parse(ARGV[4]) or nil
  if ARGV[8] == '1' then
    local deposed = sched_fence(ARGV[9])
    if deposed then return deposed end
    local mine = redis.call('HGET', K_ALLOCS, id)
    if mine and cjson.decode(mine).h == 1 then return { 'alloc', mine, now } end
  end
  if redis.call('HGET', K_POOL, 'stopped') == '1' then return { 'err', 'pool_stopped' } end
  if cordoned() then return { 'err', 'pool_cordoned' } end
  if redis.call('HEXISTS', K_ALLOCS, id) == 1 or redis.call('HEXISTS', K_ENDED, id) == 1 then
    return { 'err', 'alloc_id_taken' }
  end
  local capacity = parse(redis.call('HGET', K_POOL, 'capacity'))
  if not fits(capacity, want_min) then return { 'err', 'exceeds_capacity', ARGV[3], format(capacity) } end
  capacity = usable()
  -- Every alloc but the scheduler's own leaves the room held for preemptors free.
  if ARGV[8] ~= '1' then capacity = sub(capacity, spared()) end
  local allocs = load_allocs()
  local used = held(allocs, false)
  local lapsed = {}
  for _, a in ipairs(allocs) do
    if a.e <= now then lapsed[#lapsed + 1] = a end
  end
  -- Most expired first.
  table.sort(lapsed, function(x, y) return x.e < y.e or (x.e == y.e and x.id < y.id) end)
  local victims, free = {}, sub(capacity, used)
  local i = 1
  while not fits(free, want_min) and i <= #lapsed do
    victims[#victims + 1] = lapsed[i]
    used = sub(used, parse(lapsed[i].r))
    free = sub(capacity, used)
    i = i + 1
  end
  if not fits(free, want_min) then
    redis.call('HINCRBY', K_POOL, 'stat_offer_expired', 1)
    return { 'err', 'offer_expired', ARGV[3], format(free) }
  end
  for _, victim in ipairs(victims) do end_alloc(victim, 'reclaimed') end
  local resources = want_max and min(want_max, free) or want_min
  local a = { id = id, r = format(resources), o = ARGV[5], l = cjson.decode(ARGV[6]), c = now, k = 0,
    e = now + tonumber(ARGV[7]) }
  if ARGV[8] == '1' then a.e, a.h = HELD, 1 end
  if ARGV[10] and ARGV[10] ~= '' then a.m = ARGV[10] end
  local record = encode_alloc(a)
  redis.call('HSET', K_ALLOCS, id, record)
  redis.call('ZADD', K_LEASES, a.e, id)
  redis.call('HINCRBY', K_POOL, 'stat_accepted', 1)
  emit('alloc.made', id, nil, record)
  return { 'alloc', record, now }
elseif op == 'keepalive' then
  -- keepalive(id, granted ms): the daemon capped the interval by its lease rules. Revives a
  -- lapsed alloc not yet reclaimed.
  local id = ARGV[2]
  local record, missing = live_record(id)
  if not record then return missing end
  local granted = tonumber(ARGV[3])
  local a = cjson.decode(record)
  -- The scheduler holds it until its task ends: a keepalive changes nothing.
  if a.h == 1 then return { 'alloc', record, now, granted } end
  a.k, a.e = now, now + granted
  record = encode_alloc(a)
  redis.call('HSET', K_ALLOCS, id, record)
  redis.call('ZADD', K_LEASES, a.e, id)
  emit('alloc.renewed', id, nil, record)
  return { 'alloc', record, now, granted }
elseif op == 'annotate' then
  -- annotate(id, label changes (a JSON object: a value sets the label, false removes it),
  -- metadata ('keep', 'clear' or 'set'), metadata text): its owner's notes (`Pools::annotate`);
  -- the lease is not renewed. The labels may hold at most MAX_ALLOC_LABEL_BYTES once changed.
  local id = ARGV[2]
  local record, missing = live_record(id)
  if not record then return missing end
  local a = cjson.decode(record)
  if a.h == 1 then return { 'err', 'held_by_scheduler', a.o } end
  if type(a.l) ~= 'table' then a.l = {} end
  for key, value in pairs(cjson.decode(ARGV[3])) do
    if value == false then a.l[key] = nil else a.l[key] = value end
  end
  local bytes = 0
  for key, value in pairs(a.l) do bytes = bytes + #key + #value end
  if bytes > 16384 then return { 'err', 'too_large', 'labels', bytes, 16384 } end
  if ARGV[4] == 'clear' then a.m = nil elseif ARGV[4] == 'set' then a.m = ARGV[5] end
  record = encode_alloc(a)
  redis.call('HSET', K_ALLOCS, id, record)
  emit('alloc.annotated', id, nil, record)
  return { 'alloc', record, now }
elseif op == 'label_held' then
  -- label_held(id, labels JSON, fencing): the scheduler names what is in an alloc it holds (a
  -- task that took a placeholder over). Nothing for an alloc that is gone or not held.
  local deposed = sched_fence(ARGV[4])
  if deposed then return deposed end
  local id = ARGV[2]
  local record = redis.call('HGET', K_ALLOCS, id)
  if not record then return { 'none' } end
  local a = cjson.decode(record)
  if a.h ~= 1 then return { 'none' } end
  a.l = cjson.decode(ARGV[3])
  record = encode_alloc(a)
  redis.call('HSET', K_ALLOCS, id, record)
  emit('alloc.annotated', id, nil, record)
  return { 'alloc', record, now }
elseif op == 'free' then
  -- free(id, 'held', fencing): the scheduler ends an alloc it holds.
  local id = ARGV[2]
  if ARGV[3] == 'held' then
    local deposed = sched_fence(ARGV[4])
    if deposed then return deposed end
  end
  local ended = redis.call('HGET', K_ENDED, id)
  if ended then return { 'ended', ended, now } end
  local record = redis.call('HGET', K_ALLOCS, id)
  if not record then return { 'err', 'alloc_not_found' } end
  local a = cjson.decode(record)
  a.id = id
  if a.h == 1 and ARGV[3] ~= 'held' then return { 'err', 'held_by_scheduler', a.o } end
  return { 'ended', end_alloc(a, 'freed'), now }
elseif op == 'inspect' then
  local id = ARGV[2]
  local record = redis.call('HGET', K_ALLOCS, id)
  if record then return { 'alloc', record, now } end
  local ended = redis.call('HGET', K_ENDED, id)
  if ended then return { 'ended', ended, now } end
  return { 'err', 'alloc_not_found' }
elseif op == 'allocs' then
  -- allocs(id...): those of the allocs that are live (a page: the daemon picks the ids from
  -- HKEYS Q:allocs).
  local reply = { 'allocs', now }
  for j = 2, #ARGV do
    local record = redis.call('HGET', K_ALLOCS, ARGV[j])
    if record then
      reply[#reply + 1] = ARGV[j]
      reply[#reply + 1] = record
    end
  end
  return reply
elseif op == 'stop' then
  -- stop(idle ms): stops the pool if every lease lapsed at least that long ago.
  local idle = tonumber(ARGV[2])
  local allocs = load_allocs()
  local until_idle = 0
  for _, a in ipairs(allocs) do until_idle = math.max(until_idle, a.e + idle - now) end
  if until_idle > 0 then return { 'stop', 0, until_idle } end
  for _, a in ipairs(allocs) do end_alloc(a, 'pool_stopped') end
  redis.call('HSET', K_POOL, 'stopped', 1)
  emit_pool()
  return { 'stop', 1, 0 }
elseif op == 'sweep' then
  -- sweep(reclaim after ms, retention ms): ends the allocs lapsed longer than the first, drops
  -- the ended ones kept longer than the second; answers when the next sweep has work.
  local due = redis.call('ZRANGEBYSCORE', K_LEASES, '-inf', now - tonumber(ARGV[2]), 'LIMIT', 0, 256)
  for _, id in ipairs(due) do
    local record = redis.call('HGET', K_ALLOCS, id)
    if record then
      local a = cjson.decode(record)
      a.id = id
      end_alloc(a, 'reclaimed')
    else
      redis.call('ZREM', K_LEASES, id)
    end
  end
  local old = redis.call('ZRANGEBYSCORE', K_ENDINGS, '-inf', now - tonumber(ARGV[3]), 'LIMIT', 0, 256)
  for _, id in ipairs(old) do
    redis.call('HDEL', K_ENDED, id)
    redis.call('ZREM', K_ENDINGS, id)
  end
  -- When the next sweep has something to do (ms from now; -1: nothing kept here falls due).
  local next_in = -1
  local function sooner(key, after)
    local first = redis.call('ZRANGE', key, 0, 0, 'WITHSCORES')
    if first[2] then
      local due = math.max(0, tonumber(first[2]) + after - now)
      if next_in < 0 or due < next_in then next_in = due end
    end
  end
  sooner(K_LEASES, tonumber(ARGV[2]))
  sooner(K_ENDINGS, tonumber(ARGV[3]))
  return { 'swept', #due, #old, next_in }
end
return redis.error_reply('unknown pool operation ' .. tostring(op))
