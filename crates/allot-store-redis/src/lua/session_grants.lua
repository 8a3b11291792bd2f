-- session_grants(session): the tokens a session holds here.
return redis.call('SMEMBERS', KEYS[1] .. ':sg:' .. ARGV[1])
