-- runs(op, ...): the runs of tasks, in the `{allot-runs}` slot. KEYS[1] is the prefix
-- `allot:{allot-runs}`:
--   P:runs             hash: `<app>/<task>` -> run record (JSON)
--   P:app-runs:<app>   set: the tasks of <app> that have a run (an application's runs are found
--                      without a walk over every run)
--   P:indexed          set once every run of P:runs is in its application's set (runs kept by a
--                      version without the sets are added by `index`)
--   put(app, task, record): keeps a run.
--   remove(app, task): forgets a run (idempotent).
--   forget_ended(app, task?): forgets the runs that ended of <app> (of its task <task> if given):
--     they go with their task; answers how many. A run that has not ended stays for its executor.
--   index(): adds every run to its application's set, once; answers how many were added.
--   cache(key, record, at): keeps outputs in P:catalog under <key> unless some are kept there
--     already, and <key> in P:catalog-at at <at>; answers 1 if kept.
--   forget_cached(before, limit): forgets at most <limit> outputs kept before <before>, the
--     oldest first; answers how many.
--   index_catalog(): puts every kept output of P:catalog in P:catalog-at (outputs kept by a
--     version without it), once; answers how many were added.
-- Each answers { number }.
local P = KEYS[1]
local op = ARGV[1]
local function set_of(app) return P .. ':app-runs:' .. app end
if op == 'put' then
  redis.call('HSET', P .. ':runs', ARGV[2] .. '/' .. ARGV[3], ARGV[4])
  redis.call('SADD', set_of(ARGV[2]), ARGV[3])
  emit('run.changed', ARGV[2] .. '/' .. ARGV[3], nil, ARGV[4])
  return { 1 }
elseif op == 'remove' then
  if redis.call('HDEL', P .. ':runs', ARGV[2] .. '/' .. ARGV[3]) == 1 then
    emit('run.removed', ARGV[2] .. '/' .. ARGV[3])
  end
  redis.call('SREM', set_of(ARGV[2]), ARGV[3])
  return { 1 }
elseif op == 'forget_ended' then
  local app = ARGV[2]
  local tasks
  if ARGV[3] and ARGV[3] ~= '' then tasks = { ARGV[3] } else tasks = redis.call('SMEMBERS', set_of(app)) end
  local n = 0
  for _, task in ipairs(tasks) do
    local record = redis.call('HGET', P .. ':runs', app .. '/' .. task)
    local ended = false
    if record then
      -- The stage is `"Handling"`, `{"Ending": ...}` or `{"Ended": ...}`.
      local ok, run = pcall(cjson.decode, record)
      ended = ok and type(run.stage) == 'table' and run.stage.Ended ~= nil
    end
    if not record or ended then
      if record then
        redis.call('HDEL', P .. ':runs', app .. '/' .. task)
        emit('run.removed', app .. '/' .. task)
        n = n + 1
      end
      redis.call('SREM', set_of(app), task)
    end
  end
  return { n }
elseif op == 'cache' then
  if redis.call('HSETNX', P .. ':catalog', ARGV[2], ARGV[3]) == 0 then return { 0 } end
  redis.call('ZADD', P .. ':catalog-at', ARGV[4], ARGV[2])
  return { 1 }
elseif op == 'forget_cached' then
  local due = redis.call('ZRANGEBYSCORE', P .. ':catalog-at', '-inf', '(' .. ARGV[2], 'LIMIT', 0, ARGV[3])
  for _, key in ipairs(due) do
    redis.call('HDEL', P .. ':catalog', key)
    redis.call('ZREM', P .. ':catalog-at', key)
  end
  return { #due }
elseif op == 'index_catalog' then
  if redis.call('EXISTS', P .. ':catalog-indexed') == 1 then return { 0 } end
  local n = 0
  for _, key in ipairs(redis.call('HKEYS', P .. ':catalog')) do
    local ok, record = pcall(cjson.decode, redis.call('HGET', P .. ':catalog', key))
    if ok and type(record.at) == 'number' then
      n = n + redis.call('ZADD', P .. ':catalog-at', 'NX', record.at, key)
    end
  end
  redis.call('SET', P .. ':catalog-indexed', '1')
  return { n }
elseif op == 'index' then
  if redis.call('EXISTS', P .. ':indexed') == 1 then return { 0 } end
  local n = 0
  for _, field in ipairs(redis.call('HKEYS', P .. ':runs')) do
    -- An application's id has no `/`: the first one ends it.
    local cut = string.find(field, '/', 1, true)
    if cut then
      n = n + redis.call('SADD', set_of(string.sub(field, 1, cut - 1)), string.sub(field, cut + 1))
    end
  end
  redis.call('SET', P .. ':indexed', '1')
  return { n }
end
return redis.error_reply('unknown runs op ' .. tostring(op))
