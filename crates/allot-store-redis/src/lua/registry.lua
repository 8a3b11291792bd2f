-- registry(op, kind, ...): the lists of namespaces and of pools. KEYS[1] is `allot:{allot-registry}`
-- (one hash slot); `kind` is `namespaces` or `pools`:
--   R        set of the names: every daemon writes it, the sweepers read it
--   R:by-name  zset of the same names, all scored 0, so ordered by name (bytes): pages of the list
-- The zset is rebuilt from the set whenever their sizes differ (daemons of earlier versions write
-- only the set).
local R = KEYS[1] .. ':' .. ARGV[2]
local INDEX = R .. ':by-name'
local op, name = ARGV[1], ARGV[3]

if op == 'add' then
  redis.call('SADD', R, name)
  redis.call('ZADD', INDEX, 0, name)
  return {}
elseif op == 'remove' then
  redis.call('SREM', R, name)
  redis.call('ZREM', INDEX, name)
  return {}
elseif op == 'page' then
  -- page(after or '', limit): up to `limit` names after `after`, in name order.
  if redis.call('SCARD', R) ~= redis.call('ZCARD', INDEX) then
    redis.call('DEL', INDEX)
    local names = redis.call('SMEMBERS', R)
    for first = 1, #names, 500 do
      local args = {}
      for i = first, math.min(first + 499, #names) do
        args[#args + 1] = 0
        args[#args + 1] = names[i]
      end
      redis.call('ZADD', INDEX, unpack(args))
    end
  end
  local from = name == '' and '-' or '(' .. name
  return redis.call('ZRANGE', INDEX, from, '+', 'BYLEX', 'LIMIT', 0, tonumber(ARGV[4]))
end
return redis.error_reply('unknown registry operation ' .. tostring(op))
