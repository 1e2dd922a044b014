-- The one entry script (see script.rs, "The call"), first part (then refund.lua, lease.lua,
-- pool.lua, permit.lua, settle.lua and entry_groups.lua, so that the common call below builds
-- none of their closures). A group that fails (a bad value at one of its keys) fails alone; the
-- groups after it are still decided.
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
--     op 5, a lease exchange (n = 1): the units given back and the units wanted (see lease.lua);
--     op 6, a regional pool (n = 1): its action and three values (see pool.lua); its "limit" is
--       the pool's parameters (0, then horizon, capacity, claim_ttl and keep);
--     op 7, a permit (n = 1; its limit is algorithm 0 with parameters max in flight and lease µs):
--       the permit's id and the action, 0 acquire, 1 release, 2 renew (see permit.lua);
--     op 8, settling: each cost and its kind, 1 a report, 2 a give-back (see settle.lua).
-- Reply: one string: per group in turn a status byte and its payload: 'o' and its answer (its
-- decisions, 40 bytes each; the time too for op 3; nothing for op 4; the units granted and the
-- decision for op 5; seven doubles for op 6; five doubles for op 7; the peek after each request
-- for op 8), or 'e', the length of its error message as 4 big-endian bytes, and the message.
-- Cost: one table for every limit of the call (P), one for the reply, none per request.
-- The server's clock, read once. Keys expire at an instant (PXAT, ms, rounded up): the TTL the
-- state needs, counted from this instant, and cheaper inside Redis than PX (which Redis rewrites
-- to an instant for replication, on every write).
local t = redis.call('TIME')
local server = t[1] * 1000000 + t[2]
local expiry = math.ceil(server / 1000)

local blob = ARGV[1]

-- The common call, one request alone (96 bytes: the version, one limit, one op-0 group), decided
-- as the general path below decides it, without its tables, closures and pcall (about a third of
-- the call's cost inside Redis), and with only its own algorithm's functions built
-- (`one_algorithm`, before this part: every closure the chunk defines is built again on each
-- call, and the other four algorithms' cost a GCRA decision about 7 % more instructions inside
-- Redis). An error of redis.call here fails the whole call, as a failed group of a call of one
-- group does anyway.
if #blob == 96 then
  local version, limits, a, p1, p2, p3, p4, now, op, _, _, cost =
    struct.unpack('>dddddddddddd', blob)
  if version == 0 and limits == 1 and op == 0 then
    local slack = CLIENT_SLACK_MS
    if now < 0 then
      now, slack = server, 0
    end
    local key = KEYS[1]
    local allowed, l, r, rs, rt, state = one_algorithm(a)(key, now, cost, p1, p2, p3, p4)
    if not allowed then
      return struct.pack('>BI4', 101, #l) .. l
    end
    if state then
      -- As `write` below, which this call does not build.
      redis.call('SET', key, state, 'PXAT', string.format('%d', expiry + math.ceil(rs / 1000) + slack))
    end
    -- 111: 'o'.
    return struct.pack('>Bddddd', 111, allowed, l, r, rs, rt)
  end
end

-- Writes `state` at `key` for a decision whose reset_after is `reset` µs: the key expires at the
-- call's instant (ms, rounded up) plus ceil(reset / 1000) ms, plus the client-time slack.
local function write(key, state, reset, slack)
  redis.call('SET', key, state, 'PXAT', string.format('%d', expiry + math.ceil(reset / 1000) + slack))
end

-- One request of `cost` on `key` by `decide` with parameters p1..p4: its decision as five
-- doubles, and its state written when it has one (admitted with a cost, or carried over from
-- other parameters); or nil, message.
local function settle(key, decide, now, cost, slack, p1, p2, p3, p4)
  local a, l, r, rs, rt, state = decide(key, now, cost, p1, p2, p3, p4)
  if not a then
    return nil, l
  end
  if state then
    write(key, state, rs, slack)
  end
  return struct.pack('>ddddd', a, l, r, rs, rt)
end

