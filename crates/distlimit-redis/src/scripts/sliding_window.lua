-- Sliding window counter (distlimit_core::algorithm::SlidingWindow). Parameters: limit,
-- period (µs), granule gr and steps, from Quota::window_granule.
-- Moves a state to the window of `period` holding `now`: the current count becomes the previous
-- one after exactly one window, both reset after a longer gap. Also the time elapsed in that
-- window, clamped to [0, period] (before the start, the clock went back: the start's weight).
local function roll_window(start, prev, cur, now, period)
  local s = now - now % period
  if s > start then
    if s - start == period then
      prev, cur = cur, 0
    else
      prev, cur = 0, 0
    end
    start = s
  end
  local elapsed = now - start
  if elapsed < 0 then
    elapsed = 0
  elseif elapsed > period then
    elapsed = period
  end
  return start, prev, cur, elapsed
end

local function decide_sliding_window(key, now, cost, limit, period, gr, steps)
  local start, prev, cur, wp = 0, 0, 0, period
  local v = redis.call('GET', key)
  if v then
    local len = #v
    local ok = string.byte(v) == 5 and (len == 33 or len == 25)
    if ok then
      if len == 33 then
        start, prev, cur, wp = struct.unpack('>dddd', v, 2)
      else
        start, prev, cur = struct.unpack('>ddd', v, 2)
      end
      ok = start >= 0 and start < 9007199254740992 and start % 1 == 0
        and prev >= 0 and prev < 9007199254740992 and prev % 1 == 0
        and cur >= 0 and cur < 9007199254740992 and cur % 1 == 0
        and wp >= 1 and wp < 9007199254740992 and wp % 1 == 0
    end
    if not ok then
      local fresh, err = other(v, 5, 'sliding_window', key)
      if not fresh then
        return nil, err
      end
      start, prev, cur, wp = 0, 0, 0, period
    end
  end
  -- Written under another period: the units the old windows count at now (the previous count
  -- weighed with the old granule, rounded up, plus the current count; State::carried), capped
  -- at the limit, become the current count of the new window holding now; kept even when
  -- denied.
  local carried = wp ~= period
  if carried then
    local elapsed
    start, prev, cur, elapsed = roll_window(start, prev, cur, now, wp)
    local wgr = math.ceil(wp / 1048576)
    local spent = math.ceil(prev * math.ceil((wp - elapsed) / wgr) / math.ceil(wp / wgr)) + cur
    if spent == 0 then
      start, prev, cur = 0, 0, 0
    else
      if spent > limit then
        spent = limit
      end
      start, prev, cur = now - now % period, 0, spent
    end
  end
  local elapsed
  start, prev, cur, elapsed = roll_window(start, prev, cur, now, period)
  local budget = limit * steps - prev * math.ceil((period - elapsed) / gr)
  if budget < 0 then
    budget = 0
  else
    budget = math.floor(budget / steps)
  end
  local avail = budget - cur
  if avail < 0 then
    avail = 0
  end
  local want = cost >= 1 and cost or 1
  local extra = 0
  if want <= avail then
    extra = cost
  end
  local reset = 0
  if cur + extra > 0 then
    reset = start + 2 * period - now
  elseif prev > 0 then
    reset = start + period - now
  end
  if reset < 0 then
    reset = 0
  end
  if want <= avail then
    if cost > 0 then
      return 1, limit, avail - cost, reset, 0,
        struct.pack('>Bdddd', 5, start, prev, cur + cost, period)
    end
    return 1, limit, avail, reset, 0
  end
  -- Later in this window, as the previous window's weight shrinks: it passes once
  -- prev * w <= (limit - cur - want) * steps, i.e. w <= x.
  local retry
  if prev > 0 and cur + want <= limit then
    local x = math.floor((limit - cur - want) * steps / prev)
    if x > steps then
      x = steps
    end
    if x >= 1 then
      local at = period - x * gr
      if at < 0 then
        at = 0
      end
      retry = start + at - now
    end
  end
  -- Else in the next window, where cur becomes the weighted previous count.
  if not retry then
    retry = start + period - now
    if retry < 0 then
      retry = 0
    end
    if cur > 0 then
      local room = limit - want
      if room < 0 then
        room = 0
      end
      local x = math.floor(room * steps / cur)
      if x > steps then
        x = steps
      end
      if x >= 1 then
        local at = period - x * gr
        if at > 0 then
          retry = retry + at
        end
      else
        retry = retry + period
      end
    end
  end
  if retry < 1 then
    retry = 1
  end
  if carried and cost > 0 then
    return 0, limit, avail, reset, retry, struct.pack('>Bdddd', 5, start, prev, cur, period)
  end
  return 0, limit, avail, reset, retry
end
