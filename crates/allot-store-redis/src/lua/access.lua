-- access(op, ...): the API tokens and bindings made through the API, in the `{allot-access}`
-- slot. KEYS[1] is the prefix `allot:{allot-access}`:
--   P:tokens    hash: name -> token record (JSON: the token's hash, never the token)
--   P:bindings  hash: name -> binding record (JSON)
--   P:version   integer: moves with every change (daemons read everything again when it moves)
--   P:version_by the replication ID of the primary that gave the version (see `bump`)
--   add_token(name, record): { 1 }, or { 0 } if the name is in use.
--   revoke_token(name): { 1, record }, or { 0 } if there is none.
--   put_binding(name, record): { 1 }.
--   remove_binding(name): { 1, record }, or { 0 } if there is none.
local P = KEYS[1]
local op = ARGV[1]
-- The version moves by one at each change; on a primary that did not give its last value (a
-- replica promoted, which may lack the last changes, or a restart) it first moves up to
-- `fresh_floor`, as fencing numbers do: a daemon that read a version the failover lost must see
-- the next one as moved, not as the one it has (it would keep tokens and bindings since changed).
local function bump()
  local version, _, by =
    carried_on(tonumber(redis.call('GET', P .. ':version') or '0'), redis.call('GET', P .. ':version_by'))
  redis.call('SET', P .. ':version', int(version + 1))
  redis.call('SET', P .. ':version_by', by)
end
if op == 'add_token' then
  if redis.call('HSETNX', P .. ':tokens', ARGV[2], ARGV[3]) == 0 then return { 0 } end
  bump()
  return { 1 }
elseif op == 'revoke_token' or op == 'remove_binding' then
  local hash = P .. ':bindings'
  if op == 'revoke_token' then hash = P .. ':tokens' end
  local record = redis.call('HGET', hash, ARGV[2])
  if not record then return { 0 } end
  redis.call('HDEL', hash, ARGV[2])
  bump()
  return { 1, record }
elseif op == 'put_binding' then
  redis.call('HSET', P .. ':bindings', ARGV[2], ARGV[3])
  bump()
  return { 1 }
end
return redis.error_reply('ERR unknown access op ' .. tostring(op))
