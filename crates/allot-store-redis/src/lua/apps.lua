-- apps(op, ...): the records of queues, applications and tasks, in one hash slot. KEYS[1] is
-- the prefix `allot:{allot-apps}`:
--   P:lease        the scheduler's lease (see sched_lease.lua)
--   P:queues       hash: queue path -> record (JSON)
--   P:apps         hash: application id -> record (JSON)
--   P:tasks:<app>  hash: task id -> record (JSON)
--   P:intents      what the scheduler is carrying out in the pools and namespaces (JSON, see
--                  `sched.rs`): a successor finishes or undoes it before its first cycle
-- Only the scheduler writes them, and only while its lease runs in the term it names:
--   write(holder, fencing, intents, kind, k1, k2, value, ...): sets the intents (`=` keeps them,
--     `` removes them) and applies the changes in order (kind
--     `queue` / `queue-` (k1 the path), `app` / `app-` (k1 the id; removing an application
--     removes its tasks), `task` / `task-` (k1 the application, k2 the task)); a holder whose
--     lease is not running in that term is refused with { 'err', 'deposed', current fencing }.
--   load(): every record, for a scheduler that takes the lease: { intents, queues..., '',
--     apps..., '', app, task, record, ... } as flat lists.
local P = KEYS[1]
local op = ARGV[1]
if op == 'write' then
  local now = now_ms()
  local l = redis.call('HMGET', P .. ':lease', 'holder', 'expires', 'fencing')
  local fencing = tonumber(l[3] or '0')
  if l[1] ~= ARGV[2] or tonumber(l[2] or '0') <= now or fencing ~= tonumber(ARGV[3]) then
    return { 'err', 'deposed', fencing }
  end
  if ARGV[4] == '' then redis.call('DEL', P .. ':intents')
  elseif ARGV[4] ~= '=' then redis.call('SET', P .. ':intents', ARGV[4]) end
  local n = 0
  for i = 5, #ARGV, 4 do
    local kind, k1, k2, value = ARGV[i], ARGV[i + 1], ARGV[i + 2], ARGV[i + 3]
    -- Each change is an event whose object is the record (an application's id has no `/`).
    if kind == 'queue' then
      redis.call('HSET', P .. ':queues', k1, value)
      emit('queue.put', k1, nil, value)
    elseif kind == 'queue-' then
      redis.call('HDEL', P .. ':queues', k1)
      emit('queue.removed', k1)
    elseif kind == 'app' then
      redis.call('HSET', P .. ':apps', k1, value)
      emit('app.changed', k1, nil, value)
    elseif kind == 'app-' then
      redis.call('HDEL', P .. ':apps', k1)
      redis.call('DEL', P .. ':tasks:' .. k1)
      emit('app.removed', k1)
    elseif kind == 'task' then
      redis.call('HSET', P .. ':tasks:' .. k1, k2, value)
      emit('task.changed', k1 .. '/' .. k2, nil, value)
    elseif kind == 'task-' then
      redis.call('HDEL', P .. ':tasks:' .. k1, k2)
      emit('task.removed', k1 .. '/' .. k2)
    else return redis.error_reply('unknown record kind ' .. tostring(kind)) end
    n = n + 1
  end
  return { 'written', n }
elseif op == 'load' then
  local out = { redis.call('GET', P .. ':intents') or '' }
  for _, v in ipairs(redis.call('HGETALL', P .. ':queues')) do out[#out + 1] = v end
  out[#out + 1] = ''
  local apps = redis.call('HGETALL', P .. ':apps')
  for _, v in ipairs(apps) do out[#out + 1] = v end
  out[#out + 1] = ''
  for i = 1, #apps, 2 do
    local tasks = redis.call('HGETALL', P .. ':tasks:' .. apps[i])
    for j = 1, #tasks, 2 do
      out[#out + 1] = apps[i]
      out[#out + 1] = tasks[j]
      out[#out + 1] = tasks[j + 1]
    end
  end
  return out
end
return redis.error_reply('unknown apps operation ' .. tostring(op))
