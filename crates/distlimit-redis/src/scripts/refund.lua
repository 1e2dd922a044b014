-- Refunds (op 4 of entry.lua): gives back what an all-or-nothing batch charged on `key`, after a
-- later group of the same request (in another Cluster slot) denied it. `algorithm` and p1, p2,
-- p3 (its first parameters) are those of the charge, `cost` its cost and `at` the time (µs, same
-- clock as `now`) it was decided at. Never gives back more than the state can still owe the
-- charge, so a refund never admits more than deciding without the charge would have; it may give
-- back less (the refill or expiry since the charge is not credited twice). A value that is not a
-- state of the key's algorithm is left alone. Writes keep the key's TTL (the charge's, at least
-- what the refunded state needs).
local function refund(key, algorithm, p1, p2, p3, cost, at, now)
  local elapsed = math.max(now - at, 0)
  local v = redis.pcall('GET', key)
  local new
  if type(v) == 'string' and cost > 0 then
    local tag, len = string.byte(v), #v
    -- Only states stamped with the charge's parameters (see the prelude): a state carried
    -- over to other parameters since is left alone. The stamp is kept as it is.
    if algorithm == 1 and tag == 1 and len == 41 and string.sub(v, 18) == struct.pack('>ddd',
        p1, p2, p3) then
      -- Token bucket: the deficit is additive; at most elapsed * rate of the charge refilled.
      local rate, unit = p2, p3
      local charged, credit = cost * unit, 0
      if elapsed < math.ceil(charged / rate) then
        credit = charged - elapsed * rate
      end
      local deficit, last = struct.unpack('>dd', v, 2)
      if credit > 0 then
        deficit, last = refilled(deficit, last, now, rate)
        new = struct.pack('>Bdd', 1, math.max(deficit - credit, 0), last) .. string.sub(v, 18)
      end
    elseif algorithm == 2 and tag == 2 and len == 25
        and string.sub(v, 10) == struct.pack('>dd', p1, p2) then
      -- GCRA: the theoretical arrival time moved by cost * T, less any time it was idle since.
      local credit = cost * p2 - elapsed
      if credit > 0 then
        new = struct.pack('>Bd', 2, struct.unpack('>d', v, 2) - credit) .. string.sub(v, 10)
      end
    elseif algorithm == 3 and tag == 3 and len == 25
        and string.sub(v, 18) == struct.pack('>d', p2) then
      -- Fixed window: only while the charge's window is the stored one.
      local period = p2
      local start, count = struct.unpack('>dd', v, 2)
      if start == at - at % period then
        new = struct.pack('>Bdd', 3, start, math.max(count - cost, 0)) .. string.sub(v, 18)
      end
    elseif algorithm == 5 and tag == 5 and len == 33
        and string.sub(v, 26) == struct.pack('>d', p2) then
      -- Sliding window: the charge is in the current window's count, or the previous one's.
      local period = p2
      local start, prev, cur = struct.unpack('>ddd', v, 2)
      local s = at - at % period
      if start == s then
        new = struct.pack('>Bddd', 5, start, prev, math.max(cur - cost, 0)) .. string.sub(v, 26)
      elseif start == s + period then
        new = struct.pack('>Bddd', 5, start, math.max(prev - cost, 0), cur) .. string.sub(v, 26)
      end
    elseif algorithm == 4 and tag == 4 and len % 16 == 1 then
      -- Sliding log: the charge is in the first entry at or after its instant (its own, or the
      -- newer one it was merged into); taking it from the first such entry never moves units to
      -- an earlier instant.
      local pos = 2
      while pos < len do
        local t, c = struct.unpack('>dd', v, pos)
        if t >= at then
          local rest = string.sub(v, pos + 16)
          if c > cost then
            rest = struct.pack('>dd', t, c - cost) .. rest
          end
          new = string.sub(v, 1, pos - 1) .. rest
          break
        end
        pos = pos + 16
      end
    end
  end
  if new then
    redis.call('SET', key, new, 'KEEPTTL')
  end
end
