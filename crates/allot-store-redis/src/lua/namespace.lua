-- The allot function library: this prelude, then one function per operation (the other files of
-- this directory, each wrapped by `scripts.rs`). A namespace function's one key is the
-- namespace's key prefix `allot:{<namespace>}`; every key it touches starts with it, so all of
-- them share one hash slot and the functions run unchanged on a Redis Cluster.
--
-- Keys (P = KEYS[1]):
--   P:ns        hash: quota, granted, blocked, waiting_units, fencing (the last fencing number
--               given), fencing_by (the replication ID of the primary that gave it),
--               fencing_skipped (numbers passed over after a failover), fencing_base (its value
--               at creation) and the counters stat_exhausted,
--               stat_cap_exceeded, stat_expired; the namespace exists iff this key does. Grants
--               made are counted by the fencing numbers (one per grant) and grants released are
--               the rest: made = held + released + expired
--   P:held:<project>  hash: the units the project holds (field "\n") and the units each of its
--               namespaces holds (field = the namespace; names hold no control characters).
--               Removed when the project holds nothing. One small hash per project: a big hash
--               of every scope would be a listpack that Redis searches field by field.
--   P:fencing   the fencing counter while the namespace does not exist: written when it is
--               removed and read when it is created again, so fencing numbers only go up
--   P:grants    hash token -> grant record
--   P:leases    zset of running leases: "g\n"..token (a TTL grant) and "s\n"..session (the
--               grants of a session here), scored by deadline in ms of Redis time
--   P:sg:<id>   set of the tokens that session <id> holds here
--   P:closed    zset session -> deadline: sessions closed here, refused until their deadline
--   P:queue     zset waiter id -> arrival number (first come, first served)
--   P:wreq      hash waiter id -> request record;  P:wtok  hash token -> waiter id
--   P:wdl       zset waiter id -> end of its wait (to drop waiters of a daemon that died)
--   P:woken     hash waiter id -> answer ("g\n"..token, or "x\n"..error...) until claimed
--   P:wseq      counter of waiter ids and arrival numbers
--
-- Records are fields joined by "\n" (names never contain control characters). Numbers are
-- integers below 2^53, exact in Lua's doubles, and written with %d.
--
-- Every write of a script is copied to the append-only file, and a write costs Redis several
-- times a read: the hot paths read what they need first, then write each key once (a grant is
-- one HSET each of P:grants, P:ns and its project's P:held:<project>).
--
-- Invariants: `granted` is the sum of the grants' units and never exceeds the quota when a grant
-- is made; the P:held:<project> fields are the sums per project and per scope; `blocked` is 1 iff a waiter is blocked by
-- the quota, and then no new request is granted ahead of it.

-- Bound to the call's keys and arguments by `bind` at the start of every function.
local P, K_NS, K_FENCING, K_GRANTS, K_LEASES, K_CLOSED
local K_QUEUE, K_WREQ, K_WTOK, K_WDL, K_WOKEN, K_WSEQ
local ARGV

local function bind(keys, args)
  P, ARGV = keys[1], args
  K_NS, K_FENCING, K_GRANTS = P .. ':ns', P .. ':fencing', P .. ':grants'
  K_LEASES, K_CLOSED = P .. ':leases', P .. ':closed'
  K_QUEUE, K_WREQ, K_WTOK, K_WDL = P .. ':queue', P .. ':wreq', P .. ':wtok', P .. ':wdl'
  K_WOKEN, K_WSEQ = P .. ':woken', P .. ':wseq'
end

local CHANNEL = 'allot:woken'
-- How long an abandoned waiter or an unclaimed answer is kept after its wait ended.
local GRACE_MS = 30000

local function int(n) return string.format('%d', n) end

-- `now_ms()`, the time in ms, is defined before this prelude: Redis's clock (`lua/clock.lua`) in
-- every daemon's library, a key the test sets in the tests' (`testing::TestClock`).

-- The change feed (see `feed.rs`). A call's events are appended to its slot's stream
-- `KEYS[1]..':feed'` in one entry when the call ends (every registered function flushes them),
-- so no change goes without its event and no event without its change. An event is a field-value
-- pair: its kind, and `<id>\n<cause>\n<object>` (the id names the object within the slot, the
-- object is a record the daemons decode). A call that finds the stream empty tells the daemons on
-- `allot:feed` that the slot has events to copy into the shared log; while it is not empty a
-- copy is under way, and the copier looks again after it trims what it copied.
local FEED_CHANNEL = 'allot:feed'
-- A stream no daemon copies (none runs) keeps its last events only.
local FEED_MAX = 100000
local EVENTS = {}

local function emit(kind, id, cause, object)
  EVENTS[#EVENTS + 1] = kind
  EVENTS[#EVENTS + 1] = id .. '\n' .. (cause or '') .. '\n' .. (object or '')
end

local function flush_feed(slot)
  if #EVENTS == 0 then return end
  local stream = slot .. ':feed'
  local empty = redis.call('XLEN', stream) == 0
  local at = int(now_ms())
  for first = 1, #EVENTS, 1000 do
    local entry = { 'XADD', stream, 'MAXLEN', '~', FEED_MAX, '*', 't', at }
    for i = first, math.min(first + 999, #EVENTS) do entry[#entry + 1] = EVENTS[i] end
    redis.call(unpack(entry))
  end
  EVENTS = {}
  if empty then redis.call('PUBLISH', FEED_CHANNEL, stream) end
end

local function split(s)
  local fields = {}
  for field in string.gmatch(s .. '\n', '([^\n]*)\n') do fields[#fields + 1] = field end
  return fields
end

-- The pattern of a record of `n` fields (one match instead of a loop).
-- (Built with `..` only: the string library is not reachable while the library loads.)
local function record_pattern(n)
  local pattern = '^'
  for _ = 2, n do pattern = pattern .. '([^\n]*)\n' end
  return pattern .. '([^\n]*)$'
end
local GRANT_FIELDS, REQUEST_FIELDS = record_pattern(9), record_pattern(12)

local function num(s) if s == nil or s == '' or s == false then return nil end return tonumber(s) end

-- A grant: units, fencing, granted_at, kind (n|t|s), ttl, deadline, session, project, scope.
local function enc_grant(g)
  return table.concat({ int(g.units), int(g.fencing), int(g.granted_at), g.kind, int(g.ttl), int(g.deadline),
    g.session, g.project, g.scope }, '\n')
end

local function dec_grant(s)
  local units, fencing, granted_at, kind, ttl, deadline, session, project, scope = string.match(s, GRANT_FIELDS)
  return { units = tonumber(units), fencing = tonumber(fencing), granted_at = tonumber(granted_at), kind = kind,
    ttl = tonumber(ttl), deadline = tonumber(deadline), session = session, project = project, scope = scope }
end

-- A request: token, units, project, scope, project cap, namespace cap ('' = none), kind, ttl,
-- session, session deadline; as a waiter also since and wait deadline.
local function enc_req(r)
  return table.concat({ r.token, int(r.units), r.project, r.scope, r.cap_p, r.cap_n, r.kind, int(r.ttl), r.session,
    int(r.sdl), int(r.since or 0), int(r.until_ or 0) }, '\n')
end

local function dec_req(s)
  local f = { string.match(s, REQUEST_FIELDS) }
  return { token = f[1], units = tonumber(f[2]), project = f[3], scope = f[4], cap_p = f[5], cap_n = f[6],
    kind = f[7], ttl = tonumber(f[8]), session = f[9], sdl = tonumber(f[10]), since = tonumber(f[11]),
    until_ = tonumber(f[12]) }
end

-- The request given as ARGV[first..first+9].
local function req_from_argv(first)
  return { token = ARGV[first], units = tonumber(ARGV[first + 1]), project = ARGV[first + 2],
    scope = ARGV[first + 3], cap_p = ARGV[first + 4], cap_n = ARGV[first + 5], kind = ARGV[first + 6],
    ttl = tonumber(ARGV[first + 7]), session = ARGV[first + 8], sdl = tonumber(ARGV[first + 9]) }
end

-- Token conflicts, worded as the ledger words them (`allot_core::grant_conflict`).
local function describe_scope(x) if x.project == '' then return 'none' end return x.project .. '/' .. x.scope end
local function describe_cap(cap) if cap == '' then return 'none' end return cap end
local function describe_lease(x)
  if x.kind == 't' then return 'ttl_ms ' .. int(x.ttl) elseif x.kind == 's' then return 'session ' .. x.session end
  return 'no lease'
end

-- The first field in which request `r` differs from what its token has (`h`: a grant, or the
-- waiting request when `waiting`), as {field, held, asked}; nil when `r` is a retry. A retry
-- of a grant must match its units, scope and lease; a retry of a wait, its caps too.
local function conflict(h, r, waiting)
  if h.units ~= r.units then return { 'units', int(h.units), int(r.units) } end
  if h.project ~= r.project or h.scope ~= r.scope then return { 'scope', describe_scope(h), describe_scope(r) } end
  if waiting and (h.cap_p ~= r.cap_p or h.cap_n ~= r.cap_n) then
    return { 'caps', 'project ' .. describe_cap(h.cap_p) .. ', namespace ' .. describe_cap(h.cap_n),
      'project ' .. describe_cap(r.cap_p) .. ', namespace ' .. describe_cap(r.cap_n) }
  end
  if h.kind ~= r.kind or (h.kind == 't' and h.ttl ~= r.ttl) or (h.kind == 's' and h.session ~= r.session) then
    -- A session on either side names the session; otherwise the TTLs differ.
    local field = 'ttl_ms'
    if h.kind == 's' or r.kind == 's' then field = 'session' end
    return { field, describe_lease(h), describe_lease(r) }
  end
  return nil
end

local function ns_num(field) return tonumber(redis.call('HGET', K_NS, field) or '0') end

local function held_key(project) return P .. ':held:' .. project end
-- The field of P:held:<project> that counts the whole project.
local PROJECT_TOTAL = '\n'

-- The units held by `r`'s project and by its scope.
local function scope_held(r)
  if r.project == '' then return 0, 0 end
  local v = redis.call('HMGET', held_key(r.project), PROJECT_TOTAL, r.scope)
  return tonumber(v[1] or '0'), tonumber(v[2] or '0')
end

-- The counters a grant for `r` changes, as read: granted and fencing of the namespace (and the
-- replication ID of the primary that gave its last fencing number), held_p and held_s of its
-- project and scope. A call that reads them once passes them on (`counts`).
local function read_counts(r)
  local v = redis.call('HMGET', K_NS, 'granted', 'fencing', 'fencing_by', 'fencing_skipped')
  local held_p, held_s = scope_held(r)
  return { granted = tonumber(v[1] or '0'), fencing = tonumber(v[2] or '0'), fencing_by = v[3],
    skipped = tonumber(v[4] or '0'), held_p = held_p, held_s = held_s }
end

-- Fencing numbers never go back, even when failovers lose the last writes: a namespace notes
-- the replication ID of the primary that gave its last number (`fencing_by`). A primary with
-- another one (a replica promoted in its place, which may lack the last numbers its predecessor
-- gave; or the primary restarted) first moves the numbers up to a floor taken from its clock
-- (`fresh_floor`), above anything a primary before it gave; `fencing_skipped` counts the numbers
-- passed over. The floor is not taken from the counter: a replica promoted after a promoted
-- primary whose first numbers it lacks would move the counter to where its predecessor did, and
-- give those numbers again (found by `allot-sim --redis`).
--
-- The floor is 1,024 per ms since 2025 (6.2e13 in late 2026, 2^53, the last integer a Lua number
-- holds exactly, in 2303): above every number a primary that lived before now gave, as long as
-- no primary gave more than 1,024 numbers per ms of its life (Redis runs a namespace's grants one
-- at a time, at well under 1,000 per ms) and the new primary's clock is not behind the old one's
-- by more than the failover took. A clock before 2025 (a test's) has no floor: the counter moves
-- to its next multiple of 2^32 instead.
local FENCING_EPOCH = 4294967296
local FLOOR_FROM_MS, FLOOR_PER_MS = 1735689600000, 1024

-- Where a primary that did not give `current` continues from (see above).
local function fresh_floor(current)
  local ms = now_ms() - FLOOR_FROM_MS
  local floor = (math.floor(current / FENCING_EPOCH) + 1) * FENCING_EPOCH
  if ms > 0 then floor = ms * FLOOR_PER_MS end
  return math.max(floor, current)
end

local function replication_id()
  return string.match(redis.call('INFO', 'replication'), 'master_replid:(%w+)') or ''
end

-- A counter given by the primary `given_by` (false or nil: none noted), as this primary
-- continues it: the same value if this primary gave it, else `fresh_floor` (see above). Returns
-- the value, whether it moved, and this primary's replication ID, to note beside the next value.
-- Every counter a failover may roll back (fencing numbers, feed revisions, scheduler terms, the
-- access version) goes through here.
local function carried_on(current, given_by)
  local by = replication_id()
  if given_by and given_by ~= by then return fresh_floor(current), true, by end
  return current, false, by
end

-- The refusal a cap gives `r`, as {level, cap, held}, or nil.
local function cap_refusal(r, counts)
  if r.project == '' then return nil end
  local held_p, held_s
  if counts then held_p, held_s = counts.held_p, counts.held_s else held_p, held_s = scope_held(r) end
  local cap = num(r.cap_p)
  if cap and held_p + r.units > cap then return { 'project', cap, held_p } end
  cap = num(r.cap_n)
  if cap and held_s + r.units > cap then return { 'namespace', cap, held_s } end
  return nil
end

local function count_refusal(refusal)
  if refusal then redis.call('HINCRBY', K_NS, 'stat_cap_exceeded', 1)
  else redis.call('HINCRBY', K_NS, 'stat_exhausted', 1) end
end

-- Adds `sign` × the grant's units to the namespace's, its project's and its scope's counters, and
-- with `new_fencing` takes the next fencing number, which it returns. One write per key touched,
-- after one read unless `counts` (see `read_counts`) are given.
local function add_units(g, sign, new_fencing, counts)
  local units = sign * g.units
  counts = counts or read_counts(g)
  local fencing = counts.fencing
  if new_fencing then
    local carried, _, by = carried_on(fencing, counts.fencing_by)
    local skipped = counts.skipped + carried - fencing
    fencing = carried + 1
    redis.call('HSET', K_NS, 'granted', int(counts.granted + units), 'fencing', int(fencing), 'fencing_by', by,
      'fencing_skipped', int(skipped))
  else
    redis.call('HSET', K_NS, 'granted', int(counts.granted + units))
  end
  if g.project ~= '' then
    local total = counts.held_p + units
    if total == 0 then
      redis.call('DEL', held_key(g.project))
    else
      redis.call('HSET', held_key(g.project), PROJECT_TOTAL, int(total), g.scope, int(counts.held_s + units))
    end
  end
  return fencing
end

-- The deadline a session is known to have here (0 if unknown).
local function session_deadline(session, given)
  local here = num(redis.call('ZSCORE', K_LEASES, 's\n' .. session)) or 0
  return math.max(here, given or 0)
end

-- The time a grant's lease has left, -1 when it has none.
local function grant_expires_in(g, now)
  if g.kind == 't' then return math.max(0, g.deadline - now) end
  if g.kind == 's' then return math.max(0, session_deadline(g.session, 0) - now) end
  return -1
end

-- A grant's event: its object is `<expires_in>\n<record>` (-1: no lease).
local function emit_grant(kind, token, cause, record, now)
  local expires_in = -1
  if kind == 'grant.granted' or kind == 'grant.renewed' then expires_in = grant_expires_in(dec_grant(record), now) end
  emit(kind, token, cause, int(expires_in) .. '\n' .. record)
end

local function insert_grant(r, now, counts)
  local g = { units = r.units, fencing = 0, granted_at = now, kind = r.kind, ttl = r.ttl, deadline = 0,
    session = r.session, project = r.project, scope = r.scope }
  g.fencing = add_units(g, 1, true, counts)
  if g.kind == 't' then
    g.deadline = now + g.ttl
    redis.call('ZADD', K_LEASES, g.deadline, 'g\n' .. r.token)
  elseif g.kind == 's' then
    redis.call('SADD', P .. ':sg:' .. r.session, r.token)
    redis.call('ZADD', K_LEASES, 'GT', r.sdl, 's\n' .. r.session)
  end
  local record = enc_grant(g)
  redis.call('HSET', K_GRANTS, r.token, record)
  emit_grant('grant.granted', r.token, nil, record, now)
  return record
end

-- What ended a grant (`GrantEnd`), and the kind of its event.
local GRANT_END_KINDS = { released = 'grant.released', expired = 'grant.expired',
  session_expired = 'grant.expired', session_closed = 'grant.session_closed' }

-- Removes a grant, which `cause` ended; returns its record, or nil. `record` may be given when
-- already read.
local function remove_grant(token, record, cause)
  record = record or redis.call('HGET', K_GRANTS, token)
  if not record then return nil end
  emit_grant(GRANT_END_KINDS[cause], token, cause, record, 0)
  local g = dec_grant(record)
  redis.call('HDEL', K_GRANTS, token)
  add_units(g, -1)
  if g.kind == 't' then
    redis.call('ZREM', K_LEASES, 'g\n' .. token)
  elseif g.kind == 's' then
    local set = P .. ':sg:' .. g.session
    redis.call('SREM', set, token)
    if redis.call('SCARD', set) == 0 then redis.call('ZREM', K_LEASES, 's\n' .. g.session) end
  end
  return record
end

local function forget_waiter(wid, r)
  redis.call('ZREM', K_QUEUE, wid)
  redis.call('HDEL', K_WREQ, wid)
  if redis.call('HGET', K_WTOK, r.token) == wid then redis.call('HDEL', K_WTOK, r.token) end
  redis.call('HINCRBY', K_NS, 'waiting_units', -r.units)
  -- An empty queue blocks nothing.
  if redis.call('ZCARD', K_QUEUE) == 0 then redis.call('HSET', K_NS, 'blocked', 0) end
end

-- Answers a waiter: `answer` is "g\n"..token or "x\n"..error fields.
local function answer_waiter(wid, answer, woken)
  redis.call('HSET', K_WOKEN, wid, answer)
  woken[#woken + 1] = wid
end

-- Tells the daemons where the woken waiters wait. On a cluster the message goes to the
-- namespace's own channel in its slot (sharded pub/sub: it stays on the slot's node and its
-- replicas, and follows the slot in a failover); on one Redis to the one channel.
local function publish(woken)
  if #woken == 0 then return end
  local message = P .. '\n' .. table.concat(woken, ',')
  if SHARDED then
    redis.call('SPUBLISH', P .. ':wake', message)
  else
    redis.call('PUBLISH', CHANNEL, message)
  end
end

-- The 1-based place of the waiter at `rank` and the units wanted by the waiters ahead of it.
local function place_of(rank)
  local units_ahead = 0
  if rank > 0 then
    for _, wid in ipairs(redis.call('ZRANGE', K_QUEUE, 0, rank - 1)) do
      local record = redis.call('HGET', K_WREQ, wid)
      if record then units_ahead = units_ahead + dec_req(record).units end
    end
  end
  return rank + 1, units_ahead
end

-- Grants waiters in queue order while they fit. A waiter blocked only by its cap is passed over;
-- the first waiter blocked by the quota stops the walk and marks the queue blocked.
local function admit(now, woken)
  local wids = redis.call('ZRANGE', K_QUEUE, 0, -1)
  -- `blocked` is cleared whenever the queue empties (forget_waiter).
  if #wids == 0 then return end
  local quota, granted = ns_num('quota'), ns_num('granted')
  local blocked = 0
  for _, wid in ipairs(wids) do
    local record = redis.call('HGET', K_WREQ, wid)
    local r = record and dec_req(record)
    if not r then
      redis.call('ZREM', K_QUEUE, wid)
    elseif r.kind == 's' and (redis.call('ZSCORE', K_CLOSED, r.session)
        or session_deadline(r.session, r.sdl) <= now) then
      -- Its session ended: answered, and holding no one back, whether it fits or not.
      forget_waiter(wid, r)
      answer_waiter(wid, 'x\nsession\n' .. r.session, woken)
      emit('waiter.gave_up', r.token, 'session_ended')
    elseif not cap_refusal(r) then
      if granted + r.units > quota then
        blocked = 1
        break
      end
      forget_waiter(wid, r)
      insert_grant(r, now)
      granted = granted + r.units
      answer_waiter(wid, 'g\n' .. r.token, woken)
      emit('waiter.admitted', r.token)
    end
  end
  redis.call('HSET', K_NS, 'blocked', blocked)
end

-- Releases a granted token (its record read already), then admits the waiters it made room for.
local function release_grant(token, record)
  remove_grant(token, record, 'released')
  if redis.call('ZCARD', K_QUEUE) > 0 then
    local woken = {}
    admit(now_ms(), woken)
    publish(woken)
  end
end

local function namespace_view(now)
  local v = redis.call('HMGET', K_NS, 'quota', 'granted', 'waiting_units', 'fencing_base', 'stat_exhausted',
    'stat_cap_exceeded', 'stat_expired', 'fencing', 'fencing_skipped')
  local longest = 0
  local first = redis.call('ZRANGE', K_QUEUE, 0, 0)
  if first[1] then
    local record = redis.call('HGET', K_WREQ, first[1])
    if record then longest = math.max(0, now - dec_req(record).since) end
  end
  local fencing = tonumber(v[8] or '0')
  local held = redis.call('HLEN', K_GRANTS)
  local made, expired = fencing - tonumber(v[4] or '0') - tonumber(v[9] or '0'), tonumber(v[7] or '0')
  return { tonumber(v[1] or '0'), tonumber(v[2] or '0'), held, redis.call('ZCARD', K_QUEUE), tonumber(v[3] or '0'),
    longest, fencing + 1, made, tonumber(v[5] or '0'), tonumber(v[6] or '0'), math.max(0, made - held - expired),
    expired }
end

local function emit_namespace()
  emit('namespace.put', '', nil, table.concat(namespace_view(now_ms()), ','))
end

local function check_fencing(g, given)
  if given ~= '' and tonumber(given) ~= g.fencing then
    return { 'err', 'stale_fencing', tonumber(given), g.fencing }
  end
  return nil
end

local NOT_FOUND = { 'err', 'namespace_not_found' }
