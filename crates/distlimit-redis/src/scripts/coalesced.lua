-- Several callers' decisions in one call (see coalesce.rs): groups decided one after the other,
-- in the order given, each exactly as its own script would decide it (single.lua for one
-- request, batch.lua for an all-or-nothing batch): the same state, reply and TTL. A group that
-- fails (a bad value at one of its keys) fails alone; the groups after it are still decided.
-- KEYS: every group's keys in turn.
-- ARGV[1]: one string of big-endian doubles holding integers (one argument instead of several per
-- decision: Redis turns every argument into a Lua string, about 0.1 µs each):
--   the number of distinct limits, then per limit its algorithm (1 token bucket, 2 gcra, 3 fixed
--   window, 4 sliding log, 5 sliding window) and four parameter slots (unused ones 0);
--   then per group: its time (-1: the server's TIME, read once per call; else the caller's time
--   in µs) and its shape (0: one request, as single.lua; 2n + 1: a batch of n requests, as
--   batch.lua with its commit bit; 2n: the same batch without it), then per request the index of
--   its limit (1-based) and its cost.
-- Reply: one string: per group its payload in turn (ok: its decisions, 40 bytes each; failed: the
-- length of its error message as 4 big-endian bytes, then the message), then one status byte per
-- group ('o' ok, 'e' failed).
local algorithms = {decide_token_bucket, decide_gcra, decide_fixed_window, decide_sliding_log,
  decide_sliding_window}
-- The server's clock, read once. Keys expire at an instant (PXAT, ms, rounded up) instead of after
-- a span (PX): the TTL the single scripts give, counted from this instant instead of the SET's,
-- and cheaper inside Redis (a PX is rewritten to an instant for replication, on every write).
local t = redis.call('TIME')
local server = t[1] * 1000000 + t[2]
local expiry = math.ceil(server / 1000)

-- One request on `key` by `decide` with parameters `p`, as single.lua decides it.
local function one(key, decide, p, now, slack, cost)
  local a, l, r, rs, rt, state = decide(key, p, 1, now, cost)
  if not a then
    return nil, l
  end
  if state then
    redis.call('SET', key, state, 'PXAT', string.format('%d', expiry + math.ceil(rs / 1000) + slack))
  end
  return struct.pack('>ddddd', a, l, r, rs, rt)
end

-- A batch of n requests on KEYS[k ..], limits `ls` (indices into `decides` and `params`), costs
-- `cs`, as batch.lua decides it.
local function all(k, decides, params, ls, cs, now, slack, n, commit)
  local out, states, resets, allowed = {}, {}, {}, {}
  for j = 1, n do
    local l = ls[j]
    local a, l2, r, rs, rt, state = decides[l](KEYS[k + j - 1], params[l], 1, now, cs[j])
    if not a then
      return nil, l2
    end
    if a == 0 then
      commit = false
    end
    out[j] = struct.pack('>ddddd', a, l2, r, rs, rt)
    states[j], resets[j], allowed[j] = state, rs, a == 1
  end
  if commit then
    for j = 1, n do
      if states[j] then
        redis.call('SET', KEYS[k + j - 1], states[j], 'PXAT',
          string.format('%d', expiry + math.ceil(resets[j] / 1000) + slack))
      end
    end
  else
    -- Nothing is charged: a request that alone would pass reports its state as it is (a peek).
    for j = 1, n do
      if allowed[j] then
        local l = ls[j]
        local a, l2, r, rs, rt = decides[l](KEYS[k + j - 1], params[l], 1, now, 0)
        out[j] = struct.pack('>ddddd', a, l2, r, rs, rt)
      end
    end
  end
  return table.concat(out)
end

local blob = ARGV[1]
local limits, pos = struct.unpack('>d', blob)
local decides, params = {}, {}
for l = 1, limits do
  local a, p1, p2, p3, p4
  a, p1, p2, p3, p4, pos = struct.unpack('>ddddd', blob, pos)
  decides[l], params[l] = algorithms[a], {p1, p2, p3, p4}
end
local out, status, g, k, size = {}, {}, 0, 1, #blob
while pos <= size do
  local now, shape, slack
  now, shape, pos = struct.unpack('>dd', blob, pos)
  if now < 0 then
    now, slack = server, 0
  else
    slack = CLIENT_SLACK_MS
  end
  local ok, reply, err
  if shape == 0 then
    local l, cost
    l, cost, pos = struct.unpack('>dd', blob, pos)
    ok, reply, err = pcall(one, KEYS[k], decides[l], params[l], now, slack, cost)
    k = k + 1
  else
    local n, ls, cs = math.floor(shape / 2), {}, {}
    for j = 1, n do
      ls[j], cs[j], pos = struct.unpack('>dd', blob, pos)
    end
    ok, reply, err = pcall(all, k, decides, params, ls, cs, now, slack, n, shape % 2 == 1)
    k = k + n
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
end
return table.concat(out) .. table.concat(status)
