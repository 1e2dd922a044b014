-- One decision on KEYS[1] by `decide` (bound just above to one algorithm's function).
-- ARGV: time ('' = the server's TIME), cost, then the algorithm's parameters.
-- Reply: allowed, limit, remaining, reset_after_us, retry_after_us as five big-endian doubles.
local key, now, slack = KEYS[1], ARGV[1], 0
if now == '' then
  local t = redis.call('TIME')
  now = t[1] * 1000000 + t[2]
else
  now, slack = tonumber(now), CLIENT_SLACK_MS
end
local a, l, r, rs, rt, state = decide(key, ARGV, 3, now, tonumber(ARGV[2]))
if not a then
  return redis.error_reply(l)
end
if state then
  -- %d: exact below 2^53, and cheaper than redis.call's own %.17g formatting of a number.
  redis.call('SET', key, state, 'PX', string.format('%d', math.ceil(rs / 1000) + slack))
end
return struct.pack('>ddddd', a, l, r, rs, rt)
