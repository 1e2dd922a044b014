-- Settling (op 8 of entry.lua): reports and give-backs, every one applied, in order
-- (distlimit_core::Limit::force_from and Limit::give_back_from). `rs[j]` is the request's limit
-- (its index in P), its cost and its kind (1 a report, 2 a give-back). Every value is read first,
-- so a bad value at one key fails the group before anything is written. Each request answers the
-- peek after it (five doubles). A report charges whatever is left: the token bucket's deficit may
-- pass a full bucket, up to 3 * 2^51 units (distlimit_core::MAX_DEFICIT), GCRA's arrival time may
-- pass now + burst * T, up to 2^53 - 1 (MAX_TAT): the debt. A give-back is a lease exchange
-- taking nothing (lease.lua).
local function settle_all(k, P, rs, now, slack, n)
  for j = 1, n do
    local key, b = KEYS[k + j - 1], rs[j][1]
    local a, v = P[b], redis.call('GET', key)
    if a ~= 1 and a ~= 2 then
      return nil, 'DISTLIMIT_ARGS reports and give-backs need the token bucket or GCRA'
    end
    if v then
      local ok, err
      if a == 1 then
        ok, err = read_token_bucket(v, key, P[b + 1], P[b + 2], P[b + 3], now)
      else
        ok, err = read_gcra(v, key, P[b + 1], P[b + 2], now)
      end
      if not ok then
        return nil, err
      end
    end
  end
  local out = {}
  for j = 1, n do
    local key, b, cost, kind = KEYS[k + j - 1], rs[j][1], rs[j][2], rs[j][3]
    local a, p1, p2, p3 = P[b], P[b + 1], P[b + 2], P[b + 3]
    if kind == 1 then
      local state, ttl
      if a == 1 then
        local rate, unit = p2, p3
        local d, last = read_token_bucket(redis.call('GET', key), key, p1, rate, unit, now)
        d, last = refilled(d, last, now, rate)
        d = math.min(d + cost * unit, 6755399441055744)
        state, ttl = struct.pack('>Bddddd', 1, d, last, p1, rate, unit), last - now + math.ceil(d / rate)
      else
        local tat = math.max(read_gcra(redis.call('GET', key), key, p1, p2, now), now)
        tat = math.min(tat + cost * p2, 9007199254740991)
        state, ttl = struct.pack('>Bddd', 2, tat, p1, p2), tat - now
      end
      store(key, state, ttl, slack)
      local d1, d2, d3, d4, d5 = algorithms[a](key, now, 0, p1, p2, p3)
      out[j] = struct.pack('>ddddd', d1, d2, d3, d4, d5)
    else
      local reply, err = lease(key, a, p1, p2, p3, now, cost, 0, slack)
      if not reply then
        return nil, err
      end
      out[j] = string.sub(reply, 9)
    end
  end
  return table.concat(out)
end
