-- view(): the namespace's numbers. Replies {view...} | {'err', ...}.
if redis.call('EXISTS', K_NS) == 0 then return NOT_FOUND end
return namespace_view(now_ms())
