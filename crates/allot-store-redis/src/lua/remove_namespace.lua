-- remove_namespace(force): removes a namespace, its grants (only with force, and never while
-- allot holds one for a task) and its waiters
-- (they are answered namespace_not_found). The fencing counter stays, so a re-created namespace
-- keeps counting up. Replies {'removed', grants} | {'err', ...}.
if redis.call('EXISTS', K_NS) == 0 then return NOT_FOUND end
local grants = redis.call('HLEN', K_GRANTS)
-- allot's own grants (tokens that begin with `@`) end with their tasks and runs, never here.
if grants > 0 then
  local held, first = 0, nil
  for _, token in ipairs(redis.call('HKEYS', K_GRANTS)) do
    if string.sub(token, 1, 1) == '@' then
      held = held + 1
      first = first or token
    end
  end
  if held > 0 then return { 'err', 'held_by_scheduler', held, first } end
end
if grants > 0 and ARGV[1] ~= '1' then return { 'err', 'namespace_in_use', grants } end
local woken = {}
for _, wid in ipairs(redis.call('ZRANGE', K_QUEUE, 0, -1)) do
  answer_waiter(wid, 'x\nnamespace_not_found', woken)
  local record = redis.call('HGET', K_WREQ, wid)
  if record then emit('waiter.gave_up', dec_req(record).token, 'namespace_removed') end
end
for _, member in ipairs(redis.call('ZRANGE', K_LEASES, 0, -1)) do
  if string.sub(member, 1, 2) == 's\n' then redis.call('DEL', P .. ':sg:' .. string.sub(member, 3)) end
end
-- The projects that hold something are those of the grants; each counter hash goes once.
local projects = {}
local all = redis.call('HGETALL', K_GRANTS)
for i = 2, #all, 2 do
  local project = dec_grant(all[i]).project
  if project ~= '' and not projects[project] then
    projects[project] = true
    redis.call('DEL', held_key(project))
  end
end
redis.call('SET', K_FENCING, redis.call('HGET', K_NS, 'fencing') or '0')
local fencing_by = redis.call('HGET', K_NS, 'fencing_by')
if fencing_by then redis.call('SET', K_FENCING .. '_by', fencing_by) end
redis.call('DEL', K_NS, K_GRANTS, K_LEASES, K_CLOSED, K_QUEUE, K_WREQ, K_WTOK, K_WDL)
-- The answers stay a while for their callers to claim.
redis.call('PEXPIRE', K_WOKEN, 2 * GRACE_MS)
publish(woken)
emit('namespace.removed', '')
return { 'removed', grants }
