-- put_namespace(quota, create_only): creates a namespace or changes its quota. Raising a quota
-- admits waiters; lowering it revokes nothing and cancels no waiter (a quota of 0 pauses the
-- namespace). With create_only = 1 an existing namespace is left
-- as it is (the configuration file seeds quotas only where none exist).
-- Replies {created, view...}.
local now = now_ms()
local quota, create_only = tonumber(ARGV[1]), ARGV[2] == '1'
local created = redis.call('EXISTS', K_NS) == 0
if not created and create_only then
  local view = namespace_view(now)
  table.insert(view, 1, 0)
  return view
end
redis.call('HSET', K_NS, 'quota', int(quota))
if created then
  local fencing = redis.call('GET', K_FENCING) or '0'
  -- The primary the counter is known from, from the start: a namespace whose first numbers a
  -- failover lost does not give them again (see `fresh_floor`).
  local by = redis.call('GET', K_FENCING .. '_by') or replication_id()
  redis.call('HSET', K_NS, 'granted', 0, 'fencing', fencing, 'fencing_base', fencing, 'fencing_by', by)
  -- Answers left by a removed namespace of this name no longer expire with it: the new one's
  -- answers go in the same hash. Their callers have the grace time to claim them, as any.
  if redis.call('PERSIST', K_WOKEN) == 1 then
    for _, wid in ipairs(redis.call('HKEYS', K_WOKEN)) do redis.call('ZADD', K_WDL, now - 1, wid) end
  end
end
local woken = {}
admit(now, woken)
publish(woken)
emit_namespace()
local view = namespace_view(now)
table.insert(view, 1, created and 1 or 0)
return view
