-- Fixed window (distlimit_core::algorithm::FixedWindow). Parameters: limit, period (µs).
local function decide_fixed_window(key, now, cost, limit, period)
  local start, count, wp = 0, 0, period
  local v = redis.call('GET', key)
  if v then
    local len = #v
    local ok = string.byte(v) == 3 and (len == 25 or len == 17)
    if ok then
      if len == 25 then
        start, count, wp = struct.unpack('>ddd', v, 2)
      else
        start, count = struct.unpack('>dd', v, 2)
      end
      ok = start >= 0 and start < 9007199254740992 and start % 1 == 0
        and count >= 0 and count < 9007199254740992 and count % 1 == 0
        and wp >= 1 and wp < 9007199254740992 and wp % 1 == 0
    end
    if not ok then
      local fresh, err = other(v, 3, 'fixed_window', key)
      if not fresh then
        return nil, err
      end
      start, count, wp = 0, 0, period
    end
  end
  -- Written under another period: the count of the old window holding now (State::carried),
  -- capped at the limit, is counted in the new window holding now; kept even when denied.
  local carried = wp ~= period
  if carried then
    if now - now % wp > start then
      count = 0
    end
    if count == 0 then
      start = 0
    else
      start = now - now % period
      if count > limit then
        count = limit
      end
    end
  end
  -- Windows are aligned to multiples of the period; before the stored start (the clock went
  -- back) the stored window stays current.
  local s = now - now % period
  if s > start then
    start, count = s, 0
  end
  local avail = limit - count
  if avail < 0 then
    avail = 0
  end
  -- Until the end of the window: at least 1 µs, as start >= now - now % period.
  local left = start + period - now
  local want = cost >= 1 and cost or 1
  if want <= avail then
    local reset = 0
    if count + cost > 0 then
      reset = left
    end
    if cost > 0 then
      return 1, limit, avail - cost, reset, 0,
        struct.pack('>Bddd', 3, start, count + cost, period)
    end
    return 1, limit, avail, reset, 0
  end
  local reset = 0
  if count > 0 then
    reset = left
  end
  if carried and cost > 0 then
    return 0, limit, avail, reset, left, struct.pack('>Bddd', 3, start, count, period)
  end
  return 0, limit, avail, reset, left
end
