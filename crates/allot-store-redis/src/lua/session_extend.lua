-- session_extend(session, deadline): a session's keepalive reaches its grants here.
if redis.call('EXISTS', K_NS) == 0 then return { 0 } end
return { redis.call('ZADD', K_LEASES, 'XX', 'GT', 'CH', ARGV[2], 's\n' .. ARGV[1]) }
