-- feed(op, ...): the shared change log (see `feed.rs`). Copies a slot's events (its stream
-- `<slot>:feed`, written by the call that made the changes) into one log in the `{allot-feed}`
-- slot, where every event gets its revision. KEYS[1] is `allot:{allot-feed}` (F) for `copy`, a
-- slot's stream for `trim`:
--   F:log      stream, one entry per event, id `0-<revision>`: s (the stream it came from), t (its
--              time, ms), k (its kind), v (`<id>\n<cause>\n<object>`)
--   F:meta     hash: rev (the last revision given), rev_by (the replication ID of the primary
--              that gave it), compacted (every event after it is in F:log)
--   F:cursors  hash: a slot's stream -> the id of its last entry copied
--   copy(stream, cursor, new cursor, retain events, retain ms, then per event: t, kind, value):
--     appends the events, in order, if `cursor` is the stream's cursor (else another daemon
--     copied them: {'moved', cursor}); then drops what retention no longer keeps (by count and
--     by age: `retain`). {'copied', last revision}
--   retain(retain events, retain ms): drops what retention no longer keeps, as a copy does (a
--     daemon calls it each sweep, so that an idle log is trimmed by age too). {'retained', compacted}
--   trim(through): removes the entries of the stream KEYS[1] up to id `through` (copied).
--     {entries left}
--   note(): a log no primary gave a revision yet notes this primary as the one that gave its
--     last (none), so that a replica promoted without its first copies starts above them
--     (every daemon calls it as it opens). {'noted'}
-- Invariants: each stream's entries are copied once, in their order (the cursor moves only here,
-- and only from the value the copier read). A revision is never given to two events: a primary
-- other than the one that gave the last revision (a replica promoted, which may lack the last
-- copies; or a restart) first moves the revisions to a floor from its clock, past anything a
-- primary before it gave (`fresh_floor`, as fencing numbers), and takes everything before as
-- compacted, so a watcher lists again rather than miss a copy the failover lost.
local op = ARGV[1]

-- Drops from the log what retention no longer keeps: all but the newest `keep` entries, and
-- those older than `ms` (at most 10,000 a call; the next call goes on). Sets `compacted` below
-- the oldest entry left (or to `rev` when none is). Every copy calls it: the pages it reads grow
-- from 8 entries (a copy usually finds none aged, or about as many as it adds) to 1,000, so a
-- call costs what it drops, not a page of the log's 1,000 oldest entries (about 1 ms a copy:
-- docs/benchmarks.md, "The Redis backend").
local function retain(K_LOG, K_META, keep, ms, rev)
  if redis.call('XLEN', K_LOG) > keep then redis.call('XTRIM', K_LOG, 'MAXLEN', keep) end
  local horizon = now_ms() - ms
  local count, looked = 8, 0
  while looked < 10000 do
    local page = redis.call('XRANGE', K_LOG, '-', '+', 'COUNT', count)
    local keep_from = nil
    for _, entry in ipairs(page) do
      if tonumber(entry[2][4]) >= horizon then keep_from = entry[1]; break end
    end
    if keep_from then
      redis.call('XTRIM', K_LOG, 'MINID', keep_from)
      break
    end
    if #page == 0 then break end
    local last = page[#page][1]
    local seq = tonumber(string.match(last, '^0%-(%d+)$'))
    redis.call('XTRIM', K_LOG, 'MINID', '0-' .. int(seq + 1))
    looked = looked + #page
    count = math.min(count * 8, 1000)
  end
  local head = redis.call('XRANGE', K_LOG, '-', '+', 'COUNT', 1)[1]
  local compacted = rev
  if head then compacted = tonumber(string.match(head[1], '^0%-(%d+)$')) - 1 end
  redis.call('HSET', K_META, 'compacted', int(compacted))
  return compacted
end

if op == 'copy' then
  local F = KEYS[1]
  local K_LOG, K_META, K_CURSORS = F .. ':log', F .. ':meta', F .. ':cursors'
  local stream = ARGV[2]
  local cursor = redis.call('HGET', K_CURSORS, stream) or '0-0'
  if cursor ~= ARGV[3] then return { 'moved', cursor } end
  local meta = redis.call('HMGET', K_META, 'rev', 'rev_by')
  local rev, moved, by = carried_on(tonumber(meta[1] or '0'), meta[2])
  if moved then redis.call('DEL', K_LOG) end
  for i = 7, #ARGV, 3 do
    rev = rev + 1
    redis.call('XADD', K_LOG, '0-' .. int(rev), 's', stream, 't', ARGV[i], 'k', ARGV[i + 1], 'v', ARGV[i + 2])
  end
  redis.call('HSET', K_META, 'rev', int(rev), 'rev_by', by)
  redis.call('HSET', K_CURSORS, stream, ARGV[4])
  retain(K_LOG, K_META, tonumber(ARGV[5]), tonumber(ARGV[6]), rev)
  return { 'copied', rev }
elseif op == 'note' then
  redis.call('HSETNX', KEYS[1] .. ':meta', 'rev_by', replication_id())
  return { 'noted' }
elseif op == 'retain' then
  local F = KEYS[1]
  local K_LOG, K_META = F .. ':log', F .. ':meta'
  local rev = tonumber(redis.call('HGET', K_META, 'rev') or '0')
  return { 'retained', int(retain(K_LOG, K_META, tonumber(ARGV[2]), tonumber(ARGV[3]), rev)) }
elseif op == 'trim' then
  local ms, seq = string.match(ARGV[2], '^(%d+)-(%d+)$')
  redis.call('XTRIM', KEYS[1], 'MINID', ms .. '-' .. int(tonumber(seq) + 1))
  return { redis.call('XLEN', KEYS[1]) }
end
return redis.error_reply('unknown feed operation ' .. tostring(op))
