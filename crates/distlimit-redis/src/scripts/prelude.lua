-- distlimit prelude, shared by every script (see script.rs for the argument layout, the reply and
-- the state encodings).
--
-- Exactness: Lua numbers are IEEE doubles. Every integer below 2^53 is exact, and so are +, -
-- and * of such integers while the result stays below 2^53, and math.floor(a / b) and
-- math.ceil(a / b) for 0 <= a < 2^53 and b >= 1: the correctly rounded quotient of a
-- non-multiple is at least 1/b away from an integer, more than its rounding error. (Never
-- (a + b - 1) / b: the sum may leave the exact range.) distlimit_core::Quota's bounds keep every
-- intermediate value below 2^53, so these scripts compute exactly what the Rust reference model
-- (Limit::decide) computes.
--
-- Cost: Redis runs the whole script body on every call, so each `local function` is a new closure
-- per call (about 40 ns), dearer the more outer locals it captures, and so is every table. The hot path therefore uses the globals
-- (redis.call, math.ceil, struct.pack, ...) directly, and the prelude defines a single helper, for
-- the rare path.
--
-- Every algorithm is `decide_<name>(key, now, cost, p1, p2, ...)`: its quota parameters are
-- p1, p2, ... (integers precomputed in Rust, passed as arguments: no table to build per call),
-- `cost` is at most the capacity (Rust answers costs above it). It reads the key's state (GET) and returns
--   allowed (1 or 0), limit, remaining, reset_after_us, retry_after_us[, new state]
-- exactly as Limit::evaluate; the new state (a string) only when allowed with cost > 0, for the
-- caller to write with a TTL of ceil(reset_after_us / 1000) ms (the reset_after of an admitted
-- request is State::expires_at - now, at least 1 µs). A denied request with a cost also returns
-- a state when it carried one over from other parameters (its reset_after is then that state's
-- expires_at - now, at least 1 µs: a denial leaves units spent). A value it cannot read makes it return
-- nil, message. The state values are script.rs's "State encoding".

-- A key written in client-time mode lives this much longer than its state needs (see
-- CLIENT_TTL_SLACK in script.rs): Redis expires keys on its own clock, not the client's.
local CLIENT_SLACK_MS = 60000

-- For a value `v` at `key` that is not a readable state of algorithm `own` (tag byte): true when
-- it is a well-formed state of another algorithm (the key then counts as fresh, as in the Rust
-- model), else nil and the DISTLIMIT_CORRUPT error.
local function other(v, own, name, key)
  local tag, len = string.byte(v), #v
  if tag ~= own and (tag == 1 and (len == 41 or len == 17) or tag == 2 and (len == 25 or len == 9)
      or tag == 3 and (len == 25 or len == 17) or tag == 5 and (len == 33 or len == 25)
      or tag == 4 and len % 16 == 1) then
    return true
  end
  return nil, 'DISTLIMIT_CORRUPT unreadable ' .. name .. ' state at key ' .. key
end
