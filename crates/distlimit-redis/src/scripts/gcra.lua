-- GCRA (distlimit_core::algorithm::Gcra). Parameters: burst, T = ceil(period / limit) (µs per
-- unit).
-- Reads `v`, the value at `key` (nil when there is none), as a GCRA state under burst and T at
-- `now`: its arrival time, carried over first when it was written under another burst or T
-- (State::carried: the whole units spent then, rounded up, capped at the burst, are spent now),
-- and whether it was; then whether it read as fresh (no value, or a well-formed state of another
-- algorithm). A value it cannot read: nil, message.
local function read_gcra(v, key, burst, t, now)
  local tat, wb, wt = 0, burst, t
  if not v then
    return 0, false, true
  end
  local len = #v
  local ok = string.byte(v) == 2 and (len == 25 or len == 9)
  if ok then
    if len == 25 then
      tat, wb, wt = struct.unpack('>ddd', v, 2)
    else
      tat = struct.unpack('>d', v, 2)
    end
    ok = tat >= 0 and tat < 9007199254740992 and tat % 1 == 0
      and wb >= 1 and wb < 9007199254740992 and wb % 1 == 0
      and wt >= 1 and wt < 9007199254740992 and wt % 1 == 0
  end
  if not ok then
    local fresh, err = other(v, 2, 'gcra', key)
    if not fresh then
      return nil, err
    end
    return 0, false, true
  end
  local carried = wb ~= burst or wt ~= t
  if carried and tat > now then
    local spent = math.ceil((tat - now) / wt)
    if spent > burst then
      spent = burst
    end
    tat = now + spent * t
  end
  return tat, carried, false
end

local function decide_gcra(key, now, cost, burst, t)
  -- A carried-over state is kept even when denied.
  local tat, carried = read_gcra(redis.call('GET', key), key, burst, t, now)
  if not tat then
    return nil, carried
  end
  -- The debt: µs of emission the key is ahead of now (an idle key skips the division).
  local debt, avail = tat - now, burst
  if debt > 0 then
    avail = burst - math.ceil(debt / t)
    if avail < 0 then
      avail = 0
    end
  else
    debt = 0
  end
  local want = cost >= 1 and cost or 1
  if want <= avail then
    local reset = debt + cost * t
    if cost > 0 then
      -- The new tat, max(tat, now) + cost * T, is now + reset.
      return 1, burst, avail - cost, reset, 0, struct.pack('>Bddd', 2, now + reset, burst, t)
    end
    return 1, burst, avail, reset, 0
  end
  local retry = debt - (burst - want) * t
  if retry < 1 then
    retry = 1
  end
  if carried and cost > 0 then
    return 0, burst, avail, debt, retry, struct.pack('>Bddd', 2, tat, burst, t)
  end
  return 0, burst, avail, debt, retry
end
