-- grants(token): one grant; grants('', token...): the grants of those tokens that are granted (a
-- page: the daemon picks the tokens from HKEYS P:grants). Replies {now, token, record,
-- expires_in, ...} | {'err', ...}.
local now = now_ms()
if redis.call('EXISTS', K_NS) == 0 then return NOT_FOUND end
local reply = { now }
local function add(token, record)
  reply[#reply + 1] = token
  reply[#reply + 1] = record
  reply[#reply + 1] = grant_expires_in(dec_grant(record), now)
end
if ARGV[1] ~= '' then
  local record = redis.call('HGET', K_GRANTS, ARGV[1])
  if not record then return { 'err', 'grant_not_found' } end
  add(ARGV[1], record)
  return reply
end
for i = 2, #ARGV do
  local record = redis.call('HGET', K_GRANTS, ARGV[i])
  if record then add(ARGV[i], record) end
end
return reply
