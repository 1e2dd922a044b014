-- The one entry script (see script.rs, "The call"): every call carries one or more groups, decided
-- one after the other in the order given, each alone (a single request, an all-or-nothing batch,
-- a refund or a lease exchange). A group that fails (a bad value at one of its keys) fails alone;
-- the groups after it are still decided.
-- KEYS: every group's keys in turn.
-- ARGV[1]: one string of big-endian doubles holding integers (one argument instead of several per
-- decision: Redis turns every argument into a Lua string, about 0.1 µs each):
--   the format's version (0, eight zero bytes: see script.rs), the number of distinct limits,
--   then per limit its algorithm (1 token bucket, 2 gcra, 3 fixed window, 4 sliding log,
--   5 sliding window) and four parameter slots (unused ones 0);
--   then per group: its time (-1: the server's TIME; else the caller's time in µs), its op and
--   its number of requests n, then per request the index of its limit (1-based) and:
--     op 0, one request (n = 1): its cost; it writes a state carried over even when denied;
--     op 1, 2, 3, a batch: each cost; 1 evaluates (charges nothing), 2 charges if every request
--       is admitted, 3 does as 2 and appends the time decided at (one double);
--     op 4, a refund: each cost and the time it was charged at (see refund.lua);
--     op 5, a lease exchange (n = 1): the units given back and the units wanted (see lease.lua).
-- Reply: one string: per group its payload in turn (ok: its decisions, 40 bytes each, the time for
-- op 3, nothing for op 4, the units granted and the decision for op 5; failed: the length of its
-- error message as 4 big-endian bytes, then the message), then one status byte per group ('o' ok,
-- 'e' failed).
local algorithms = {decide_token_bucket, decide_gcra, decide_fixed_window, decide_sliding_log,
  decide_sliding_window}
-- The server's clock, read once. Keys expire at an instant (PXAT, ms, rounded up): the TTL the
-- state needs, counted from this instant, and cheaper inside Redis than PX (which Redis rewrites
-- to an instant for replication, on every write).
local t = redis.call('TIME')
local server = t[1] * 1000000 + t[2]
local expiry = math.ceil(server / 1000)

-- One request on `key` by `decide` with parameters `p`: its decision, and its state written when
-- it has one (admitted with a cost, or carried over from other parameters).
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
-- `cs`: every request is evaluated first (no writes), and only if every one is allowed (and
-- `commit`) are the admitted states written; otherwise the requests that alone would pass are
-- answered as peeks (cost 0), since nothing was charged.
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
local version, limits, pos = struct.unpack('>dd', blob)
if version ~= 0 then
  return redis.error_reply('DISTLIMIT_ARGS unknown argument format ' .. version)
end
local decides, params, ids = {}, {}, {}
for l = 1, limits do
  local a, p1, p2, p3, p4
  a, p1, p2, p3, p4, pos = struct.unpack('>ddddd', blob, pos)
  decides[l], params[l], ids[l] = algorithms[a], {p1, p2, p3, p4}, a
end
local out, status, g, k, size = {}, {}, 0, 1, #blob
while pos <= size do
  local now, op, n, slack
  now, op, n, pos = struct.unpack('>ddd', blob, pos)
  if now < 0 then
    now, slack = server, 0
  else
    slack = CLIENT_SLACK_MS
  end
  local ok, reply, err
  if op == 0 then
    local l, cost
    l, cost, pos = struct.unpack('>dd', blob, pos)
    ok, reply, err = pcall(one, KEYS[k], decides[l], params[l], now, slack, cost)
  elseif op <= 3 then
    local ls, cs = {}, {}
    for j = 1, n do
      ls[j], cs[j], pos = struct.unpack('>dd', blob, pos)
    end
    ok, reply, err = pcall(all, k, decides, params, ls, cs, now, slack, n, op >= 2)
    if ok and reply and op == 3 then
      reply = reply .. struct.pack('>d', now)
    end
  elseif op == 4 then
    local rs = {}
    for j = 1, n do
      local l, cost, at
      l, cost, at, pos = struct.unpack('>ddd', blob, pos)
      rs[j] = {KEYS[k + j - 1], ids[l], params[l], cost, at}
    end
    ok, reply = pcall(function()
      for j = 1, n do
        local r = rs[j]
        refund(r[1], r[2], r[3], r[4], r[5], now)
      end
      return ''
    end)
  else
    local l, back, want
    l, back, want, pos = struct.unpack('>ddd', blob, pos)
    ok, reply, err = pcall(lease, KEYS[k], ids[l], params[l], now, back, want, expiry, slack)
  end
  k = k + n
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
