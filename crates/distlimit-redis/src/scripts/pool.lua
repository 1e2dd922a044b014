-- Regional pools (op 6 of entry.lua; distlimit_redis::RegionStore): units a region withdrew
-- from its home store, which the region's instances spend. The state at `key` is the byte 7 then
-- nine doubles: units (held by the region, unspent), expires (µs: when they are due home),
-- claim (µs: until when one instance's refill is under way), demand (units asked since `since`),
-- since (µs), denied (µs: home had nothing before this), failing (1: the last refill failed),
-- target (the size of the last refill's pool), lag (µs: how long refills take, a moving average).
-- `horizon` (µs) is how long deposited units stay, `capacity` the most a pool aims at,
-- `claim_ttl` (µs) how long a refill may take before another instance may claim one, `keep`
-- (ms) the key's time to live after each write.
-- action 1, spend: give back `a` units, then withdraw `b` units if at least `c` of them are
--   there (all of b, or as many as there are when c < b; none below c); then claim a refill if
--   one is due and none is under way: the units are below half the last target, or below what
--   was asked, or expired (which then go home with the refill, unless the last refill failed).
--   The refill asks for the demand since the last claim, per µs, times three times the refills'
--   lag (at least 20 ms, at most the horizon), at least b, at most the capacity, less the units
--   left: what lasts until the next refill arrives, the next claim being made at half of it.
--   A step asking for nothing (b = 0: a peek, a sweep) asks home for nothing: it only sends
--   due units home.
-- action 2, deposit: the refill's answer: `c` = 1: home granted `a` units (none: nothing there
--   for `b` µs); `c` = 0: home failed, no claim for `b` µs.
-- Reply: seven doubles: granted, units left, the claim's units to give back home and units to
--   ask for (both 0: no claim), denied, failing, now.
local function pool(key, now, horizon, capacity, claim_ttl, keep, action, a, b, c)
  local units, expires, claim, demand, since, denied, failing, target, lag =
    0, 0, 0, 0, now, 0, 0, 0, 0
  local v = redis.call('GET', key)
  if v then
    if #v ~= 73 or string.byte(v) ~= 7 then
      return nil, 'DISTLIMIT_CORRUPT not a regional pool'
    end
    units, expires, claim, demand, since, denied, failing, target, lag =
      struct.unpack('>ddddddddd', v, 2)
  end
  local granted, back, want = 0, 0, 0
  if action == 1 then
    units = units + a
    local take = b
    if take > units then
      take = units
    end
    if take > 0 and take >= c then
      granted = take
      units = units - take
    end
    demand = demand + b
    local expired = units > 0 and now >= expires and failing == 0
    if now >= claim and (now >= denied or expired)
        and (units * 2 < target or granted < b or expired) then
      local elapsed = math.max(now - since, 1000)
      local span = math.min(math.max(3 * lag, 20000), horizon)
      local t = math.min(math.max(math.ceil(demand * span / elapsed), b), capacity)
      if expired then
        back = units
        units = 0
      end
      want = t - units
      if want < 0 or b == 0 then
        want = 0
      end
      if back > 0 or want > 0 then
        claim, demand, since, target = now + claim_ttl, 0, now, t
      end
    end
  elseif action == 2 then
    if claim > 0 then
      -- The refill's lag: from its claim (claim_ttl before the claim's end) to now.
      local took = math.max(now - (claim - claim_ttl), 0)
      if lag == 0 then
        lag = took
      else
        lag = math.floor((3 * lag + took) / 4)
      end
    end
    if c == 1 then
      units = units + a
      claim, failing, expires = 0, 0, now + horizon
      if a == 0 then
        denied = now + b
      else
        denied = 0
      end
    else
      claim, failing = now + b, 1
    end
  else
    return nil, 'DISTLIMIT_ARGS unknown pool action ' .. tostring(action)
  end
  redis.call('SET', key, struct.pack('>Bddddddddd', 7, units, expires, claim, demand, since, denied,
    failing, target, lag), 'PX', string.format('%d', keep))
  return struct.pack('>ddddddd', granted, units, back, want, denied, failing, now)
end
