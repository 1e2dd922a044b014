-- All-or-nothing decisions on KEYS[1..n]: every request is evaluated first (no writes), and only
-- if every one is allowed (and bit 0 of ARGV[2] is set) are the admitted states written; otherwise
-- the requests that alone would pass are answered as peeks (cost 0), since nothing was charged.
-- ARGV: time ('' = the server's TIME), flags (see below), then six values per key: algorithm
-- (1 token bucket, 2 gcra, 3 fixed window, 4 sliding log, 5 sliding window), cost, and four
-- parameter slots (unused ones '0').
-- Reply: the five decision fields of each key in turn, as big-endian doubles (40 bytes a key),
-- then with flag 2 the time decided at (one more double).
local now, slack = ARGV[1], 0
if now == '' then
  local t = redis.call('TIME')
  now = t[1] * 1000000 + t[2]
else
  now, slack = tonumber(now), CLIENT_SLACK_MS
end
-- ARGV[2]: bit 0 commit, bit 1 append the time decided at (8 bytes, after the decisions).
local flags = tonumber(ARGV[2])
local commit, report = flags % 2 == 1, flags >= 2
local decide = {['1'] = decide_token_bucket, ['2'] = decide_gcra, ['3'] = decide_fixed_window,
  ['4'] = decide_sliding_log, ['5'] = decide_sliding_window}
local out, states, resets, allowed = {}, {}, {}, {}
for j = 1, #KEYS do
  local key, i = KEYS[j], 3 + (j - 1) * 6
  local algorithm = ARGV[i]
  if not decide[algorithm] then
    return redis.error_reply('DISTLIMIT_ARGS unknown algorithm ' .. tostring(algorithm))
  end
  local a, l, r, rs, rt, state = decide[algorithm](key, ARGV, i + 2, now, tonumber(ARGV[i + 1]))
  if not a then
    return redis.error_reply(l)
  end
  if a == 0 then
    commit = false
  end
  out[j] = struct.pack('>ddddd', a, l, r, rs, rt)
  states[j], resets[j], allowed[j] = state, rs, a == 1
end
if commit then
  for j = 1, #KEYS do
    if states[j] then
      redis.call('SET', KEYS[j], states[j], 'PX', string.format('%d', math.ceil(resets[j] / 1000) + slack))
    end
  end
else
  -- Nothing is charged: a request that alone would pass reports its state as it is (a peek).
  for j = 1, #KEYS do
    if allowed[j] then
      local i = 3 + (j - 1) * 6
      local a, l, r, rs, rt = decide[ARGV[i]](KEYS[j], ARGV, i + 2, now, 0)
      out[j] = struct.pack('>ddddd', a, l, r, rs, rt)
    end
  end
end
if report then
  out[#KEYS + 1] = struct.pack('>d', now)
end
return table.concat(out)
