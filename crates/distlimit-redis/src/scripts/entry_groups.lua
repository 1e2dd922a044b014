-- The entry script's general path (see entry.lua): any number of groups of any op.

-- A lone pool step (120 bytes: the version, one "limit", one op-6 group; the region store's
-- every decision), decided as the general path below decides it, without its tables and pcall.
-- An error of redis.call here fails the whole call, as a failed group of a call of one group
-- does anyway.
if #blob == 120 then
  local version, limits, _, p1, p2, p3, p4, now, op, _, _, action, a, b, c =
    struct.unpack('>ddddddddddddddd', blob)
  if version == 0 and limits == 1 and op == 6 then
    if now < 0 then
      now = server
    end
    local reply, err = pool(KEYS[1], now, p1, p2, p3, p4, action, a, b, c)
    if not reply then
      -- 101: 'e'.
      return struct.pack('>BI4', 101, #err) .. err
    end
    -- 111: 'o'.
    return struct.pack('>B', 111) .. reply
  end
end

-- A batch of n requests on KEYS[k ..], limits at P[bs[j]], costs `cs`: every request is
-- evaluated first (no writes), and only if every one is allowed (and `commit`) are the admitted
-- states written; otherwise the requests that alone would pass are
-- answered as peeks (cost 0), since nothing was charged.
local function all(k, P, bs, cs, now, slack, n, commit)
  local out, states, resets, allowed = {}, {}, {}, {}
  for j = 1, n do
    local b = bs[j]
    local a, l2, r, rs, rt, state = algorithms[P[b]](KEYS[k + j - 1], now, cs[j], P[b + 1],
      P[b + 2], P[b + 3], P[b + 4])
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
        write(KEYS[k + j - 1], states[j], resets[j], slack)
      end
    end
  else
    for j = 1, n do
      if allowed[j] then
        local b = bs[j]
        local a, l2, r, rs, rt = algorithms[P[b]](KEYS[k + j - 1], now, 0, P[b + 1], P[b + 2],
          P[b + 3], P[b + 4])
        out[j] = struct.pack('>ddddd', a, l2, r, rs, rt)
      end
    end
  end
  return table.concat(out)
end

local version, limits, pos = struct.unpack('>dd', blob)
if version ~= 0 then
  return redis.error_reply('DISTLIMIT_ARGS unknown argument format ' .. version)
end
-- The limits: limit l at P[5l - 4] (its algorithm), its parameters after it.
local P = {}
for b = 1, 5 * limits, 5 do
  P[b], P[b + 1], P[b + 2], P[b + 3], P[b + 4], pos = struct.unpack('>ddddd', blob, pos)
end
local out, g, k, size = {}, 0, 1, #blob
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
    local b = 5 * l - 4
    ok, reply, err = pcall(settle, KEYS[k], algorithms[P[b]], now, cost, slack, P[b + 1],
      P[b + 2], P[b + 3], P[b + 4])
  elseif op <= 3 then
    local bs, cs = {}, {}
    for j = 1, n do
      local l
      l, cs[j], pos = struct.unpack('>dd', blob, pos)
      bs[j] = 5 * l - 4
    end
    ok, reply, err = pcall(all, k, P, bs, cs, now, slack, n, op >= 2)
    if ok and reply and op == 3 then
      reply = reply .. struct.pack('>d', now)
    end
  elseif op == 4 or op == 8 then
    -- Per request: its limit, its cost, and the time it was charged at (op 4) or its kind (op 8).
    local rs = {}
    for j = 1, n do
      local l, cost, x
      l, cost, x, pos = struct.unpack('>ddd', blob, pos)
      rs[j] = {5 * l - 4, cost, x}
    end
    if op == 8 then
      ok, reply, err = pcall(settle_all, k, P, rs, now, slack, n)
    else
      ok, reply = pcall(function()
        for j = 1, n do
          local b, cost, at = rs[j][1], rs[j][2], rs[j][3]
          refund(KEYS[k + j - 1], P[b], P[b + 1], P[b + 2], P[b + 3], cost, at, now)
        end
        return ''
      end)
    end
  elseif op == 6 then
    local l, action, a, b, c
    l, action, a, b, c, pos = struct.unpack('>ddddd', blob, pos)
    local p = 5 * l - 4
    ok, reply, err = pcall(pool, KEYS[k], now, P[p + 1], P[p + 2], P[p + 3], P[p + 4], action, a,
      b, c)
  elseif op == 7 then
    local l, id, action
    l, id, action, pos = struct.unpack('>ddd', blob, pos)
    local b = 5 * l - 4
    ok, reply, err = pcall(permit, KEYS[k], P[b + 1], P[b + 2], now, id, action, slack)
  else
    local l, back, want
    l, back, want, pos = struct.unpack('>ddd', blob, pos)
    local b = 5 * l - 4
    ok, reply, err = pcall(lease, KEYS[k], P[b], P[b + 1], P[b + 2], P[b + 3], now, back, want,
      slack)
  end
  k = k + n
  g = g + 2
  if ok and reply then
    out[g - 1], out[g] = 'o', reply
  else
    -- A redis.call error (WRONGTYPE) is a table with the message in `err`.
    if not ok then
      err = type(reply) == 'table' and reply.err or tostring(reply)
    end
    out[g - 1], out[g] = 'e', struct.pack('>I4', #err) .. err
  end
end
return table.concat(out)
