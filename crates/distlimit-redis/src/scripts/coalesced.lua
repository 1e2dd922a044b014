-- Several callers' decisions in one call (see coalesce.rs): groups decided one after the other,
-- in the order given, each exactly as its own script would decide it (single.lua for one
-- request, batch.lua for an all-or-nothing batch): the same state, reply and TTL. A group that
-- fails (a bad value at one of its keys) fails alone; the groups after it are still decided.
-- KEYS: every group's keys in turn.
-- ARGV: per group two header values, then per request its algorithm id, its cost and the
-- algorithm's parameters (3 for the token bucket, 4 for the sliding window, 2 for the others):
--   time ('' = the server's TIME, read once per call; else the caller's time in µs),
--   shape (0: one request, as single.lua; 2n + 1: a batch of n requests, as batch.lua with its
--   commit bit; 2n: the same batch without it).
-- Reply: one string: per group its payload in turn (ok: its decisions, 40 bytes each; failed: the
-- length of its error message as 4 big-endian bytes, then the message), then one status byte per
-- group ('o' ok, 'e' failed).
local decide = {['1'] = decide_token_bucket, ['2'] = decide_gcra, ['3'] = decide_fixed_window,
  ['4'] = decide_sliding_log, ['5'] = decide_sliding_window}
local width = {['1'] = 5, ['2'] = 4, ['3'] = 4, ['4'] = 4, ['5'] = 6}

-- One request (ARGV[i] its algorithm) on KEYS[k], as single.lua decides it.
local function one(k, i, now, slack)
  local key = KEYS[k]
  local a, l, r, rs, rt, state = decide[ARGV[i]](key, ARGV, i + 2, now, tonumber(ARGV[i + 1]))
  if not a then
    return nil, l
  end
  if state then
    redis.call('SET', key, state, 'PX', string.format('%d', math.ceil(rs / 1000) + slack))
  end
  return struct.pack('>ddddd', a, l, r, rs, rt)
end

-- A batch of n requests from KEYS[k] and ARGV[i], as batch.lua decides it.
local function all(k, i, now, slack, n, commit)
  local out, states, resets, allowed, at = {}, {}, {}, {}, {}
  for j = 1, n do
    local key, algorithm = KEYS[k + j - 1], ARGV[i]
    local a, l, r, rs, rt, state = decide[algorithm](key, ARGV, i + 2, now, tonumber(ARGV[i + 1]))
    if not a then
      return nil, l
    end
    if a == 0 then
      commit = false
    end
    out[j] = struct.pack('>ddddd', a, l, r, rs, rt)
    states[j], resets[j], allowed[j], at[j] = state, rs, a == 1, i
    i = i + width[algorithm]
  end
  if commit then
    for j = 1, n do
      if states[j] then
        redis.call('SET', KEYS[k + j - 1], states[j], 'PX',
          string.format('%d', math.ceil(resets[j] / 1000) + slack))
      end
    end
  else
    -- Nothing is charged: a request that alone would pass reports its state as it is (a peek).
    for j = 1, n do
      if allowed[j] then
        local a, l, r, rs, rt = decide[ARGV[at[j]]](KEYS[k + j - 1], ARGV, at[j] + 2, now, 0)
        out[j] = struct.pack('>ddddd', a, l, r, rs, rt)
      end
    end
  end
  return table.concat(out)
end

local out, status, g, k, i, server = {}, {}, 0, 1, 1, nil
while i <= #ARGV do
  local now, slack, shape = ARGV[i], 0, tonumber(ARGV[i + 1])
  if now == '' then
    if not server then
      local t = redis.call('TIME')
      server = t[1] * 1000000 + t[2]
    end
    now = server
  else
    now, slack = tonumber(now), CLIENT_SLACK_MS
  end
  i = i + 2
  local n = 1
  local ok, reply, err
  if shape == 0 then
    ok, reply, err = pcall(one, k, i, now, slack)
  else
    n = math.floor(shape / 2)
    ok, reply, err = pcall(all, k, i, now, slack, n, shape % 2 == 1)
  end
  g = g + 1
  if ok and reply then
    out[g], status[g] = reply, 'o'
  else
    -- A redis.call error (WRONGTYPE) is a table with the message in `err`.
    if not ok then
      err = type(reply) == 'table' and reply.err or tostring(reply)
    end
    out[g], status[g] = struct.pack('>I4', #err) .. err, 'e'
  end
  for _ = 1, n do
    i = i + width[ARGV[i]]
  end
  k = k + n
end
return table.concat(out) .. table.concat(status)
