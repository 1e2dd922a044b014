#!/usr/bin/env bash
# Side-by-side comparison of two Envoy RLS v3 servers written in Rust on one machine:
# distlimit-server (the distlimit checkout) and Kuadrant's limitador-server, and, with
# FLOOR_BIN, a third side on the memory phase: a bare tonic server answering a constant OK
# (the rls-floor binary: crates/distlimit-server/src/bin/rls_floor.rs), the floor of gRPC serving under the same load.
# `cargo xtask bench-rls` builds both distlimit binaries and runs this script.
#
# Adapted from the shared runner (../shared/peers/rls-bench/run.sh): its configs, helpers and
# rlsload are read from PEER (that folder); this copy adds the floor side.
#
#   PEER=../shared/peers/rls-bench bash xtask/rls-bench/run.sh
#   PHASES="verify memory" ROUNDS=1 FLOOR_BIN=target/dist/rls-floor bash xtask/rls-bench/run.sh
#
# Pinning: each server on core $SERVER_CPU (taskset), the load generators (h2load, rlsload,
# the Python clients) on core $CLIENT_CPU, redis-server unpinned.
# Load: h2load (nghttp2) sending real gRPC unary calls (one fixed body: the hot key), and
# rlsload (./rlsload, h2 crate) for many keys and for counting OK / OVER_LIMIT / errors.
# Every loop is bounded by a count; every client run by -D/-n and `timeout`; every process
# this script starts is tracked by PID and stopped by PID.
set -u

OWN=$(cd "$(dirname "$0")" && pwd)
HERE=$(cd "${PEER:-$OWN/../../../shared/peers/rls-bench}" && pwd) || { echo "PEER: no runner folder" >&2; exit 1; }
CFG=$HERE/configs
DL_BIN=${DL_BIN:-target/release/distlimit-server}
LIM_BIN=${LIM_BIN:-$HERE/bin/limitador-server}
FLOOR_BIN=${FLOOR_BIN:-}    # empty: no floor side
WORK=${WORK:-target/rls-bench}   # built tools go here (this folder may be read-only)
LOAD=${LOAD:-$WORK/release/rlsload}
PY=${PY:-$WORK/venv/bin/python}
[ -x "$LOAD" ] || cargo build -q --release --manifest-path "$HERE/rlsload/Cargo.toml" --target-dir "$WORK" || { echo "rlsload does not build" >&2; exit 1; }
[ -x "$PY" ] || { python3 -m venv "$WORK/venv" && "$WORK/venv/bin/pip" -q install grpcio xds-protos; } || { echo "python venv failed" >&2; exit 1; }
ROUNDS=${ROUNDS:-3}
DUR=${DUR:-8}            # seconds measured per throughput run (after a 1 s warm-up)
LAT_DUR=${LAT_DUR:-5}    # seconds measured per 1-in-flight latency run
CHECK_DUR=${CHECK_DUR:-2}
MANY_KEYS=${MANY_KEYS:-100000}
CAP=${CAP:-100000}       # the capped limit of configs/*/cap (per day); exactness sends 2x
EXACT_N=${EXACT_N:-200000}
PHASES=${PHASES:-"verify memory redis exact"}
SERVER_CPU=${SERVER_CPU:-1}
CLIENT_CPU=${CLIENT_CPU:-0}
OUT=${OUT:-$WORK/results/$(date -u +%Y%m%dT%H%M%SZ)}
RPC_PATH=/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit
CLK_TCK=$(getconf CLK_TCK)

mkdir -p "$OUT/logs" "$OUT/raw" "$OUT/bodies"
RES=$OUT/results.jsonl
: >"$RES"

for b in "$DL_BIN" "$LIM_BIN" "$LOAD" "$PY" ${FLOOR_BIN:+"$FLOOR_BIN"}; do
  [ -x "$b" ] || { echo "missing executable: $b" >&2; exit 1; }
done
command -v h2load >/dev/null || { echo "h2load missing (apt-get install nghttp2-client)" >&2; exit 1; }

log() { echo "[$(date -u +%H:%M:%S)] $*" | tee -a "$OUT/run.log" >&2; }

# ---- processes we start: tracked by PID, stopped by PID ---------------------------------
STARTED=()
cleanup() {
  local p
  for p in "${STARTED[@]}"; do kill -TERM "$p" 2>/dev/null; done
  sleep 0.5
  for p in "${STARTED[@]}"; do kill -KILL "$p" 2>/dev/null; done
}
trap cleanup EXIT
trap 'exit 130' INT TERM

stop_pid() { # PID: SIGTERM, wait at most 15 s, then SIGKILL
  local pid=$1 i
  kill -TERM "$pid" 2>/dev/null || return 0
  for i in $(seq 1 150); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  if kill -0 "$pid" 2>/dev/null; then log "pid $pid ignored SIGTERM for 15 s: SIGKILL"; kill -KILL "$pid" 2>/dev/null; fi
  wait "$pid" 2>/dev/null
  return 0
}

port_free() { ! ss -Htln "( sport = :$1 )" | grep -q .; }
free_port() { # BASE: the first free loopback port at or above BASE (at most 500 tried)
  local p
  for p in $(seq "$1" $(( $1 + 500 ))); do
    if port_free "$p" && [[ " ${USED_PORTS:-} " != *" $p "* ]]; then USED_PORTS="${USED_PORTS:-} $p"; echo "$p"; return 0; fi
  done
  return 1
}
G1=$(free_port 18081); H1=$(free_port 18181); G2=$(free_port 18281); H2=$(free_port 18381)
REDIS_PORT=$(free_port 16390)
REDIS_URL=redis://127.0.0.1:$REDIS_PORT

cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat" 2>/dev/null || echo 0; }
rss_kb() { awk '/^VmRSS:/{print $2}' "/proc/$1/status" 2>/dev/null || echo 0; }
hwm_kb() { awk '/^VmHWM:/{print $2}' "/proc/$1/status" 2>/dev/null || echo 0; }
load1() { cut -d' ' -f1 /proc/loadavg; }
now() { date +%s.%N; }

# ---- meta ----------------------------------------------------------------------------------
{
  echo "date_utc: $(date -u +%FT%TZ)"
  echo "host: $(uname -srm), $(nproc) cpus, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2-)"
  echo "distlimit commit: $(git rev-parse HEAD 2>/dev/null)"
  echo "distlimit-server: $DL_BIN, $(stat -c %s "$DL_BIN") bytes, $("$DL_BIN" --version 2>&1 | head -1)"
  echo "limitador commit: $(echo "${LIM_COMMIT:-2981b2bd389d42cf668519f9aa981a53541c4278}" 2>/dev/null)"
  echo "limitador-server: $LIM_BIN, $(stat -c %s "$LIM_BIN") bytes, $("$LIM_BIN" --version 2>&1 | head -1)"
  [ -n "$FLOOR_BIN" ] && echo "floor: $FLOOR_BIN, $(stat -c %s "$FLOOR_BIN") bytes (bare tonic, constant OK)"
  echo "h2load: $(h2load --version 2>&1 | head -1)"
  echo "redis-server: $(redis-server --version)"
  echo "file: $(file -b "$DL_BIN" | cut -c1-120) | $(file -b "$LIM_BIN" | cut -c1-120)"
  echo "ports: grpc $G1 $G2, http $H1 $H2, redis $REDIS_PORT"
  echo "pinning: servers on cpu $SERVER_CPU, clients on cpu $CLIENT_CPU, redis-server unpinned"
  echo "loadavg at start: $(cat /proc/loadavg)"
} | tee "$OUT/meta.txt" >&2

# ---- servers --------------------------------------------------------------------------------
# server_cmd MODE CONF GRPC_PORT HTTP_PORT -> CMD array
INSTANCES=1
server_cmd() {
  local mode=$1 conf=$2 pg=$3 ph=$4
  local lim=("$LIM_BIN" -b 127.0.0.1 -p "$pg" -B 127.0.0.1 -P "$ph" "$CFG/limitador/$conf/limits.yaml")
  local dl=("$DL_BIN" --grpc "127.0.0.1:$pg" --http "127.0.0.1:$ph")
  case $mode in
    dl-mem) CMD=("${dl[@]}" --config "$CFG/distlimit/$conf") ;;
    dl-redis) CMD=("${dl[@]}" --config "$CFG/distlimit/$conf" --redis "$REDIS_URL" --instances "$INSTANCES") ;;
    dl-lease) CMD=("${dl[@]}" --config "$CFG/distlimit/lease-$conf" --redis "$REDIS_URL" --instances "$INSTANCES" --lease "$conf") ;;
    lim-mem) CMD=("${lim[@]}") ;;  # no STORAGE subcommand: limitador's default, memory
    floor) CMD=("$FLOOR_BIN" --grpc "127.0.0.1:$pg" --http "127.0.0.1:$ph") ;;  # answers OK, decides nothing
    lim-redis) CMD=("${lim[@]}" redis "$REDIS_URL") ;;
    lim-cached) CMD=("${lim[@]}" redis_cached "$REDIS_URL") ;;
    *) echo "unknown mode $mode" >&2; return 1 ;;
  esac
}

# launch NAME MODE CONF GRPC_PORT HTTP_PORT -> SPID, STARTUP_MS; a startup record in results
launch() {
  local name=$1 mode=$2 conf=$3 pg=$4 ph=$5 t0 probe
  server_cmd "$mode" "$conf" "$pg" "$ph" || return 1
  port_free "$pg" || { log "port $pg busy"; return 1; }
  echo "${CMD[*]}" >"$OUT/logs/$name.cmd"
  t0=$(date +%s%N)
  taskset -c "$SERVER_CPU" "${CMD[@]}" >"$OUT/logs/$name.log" 2>&1 &
  SPID=$!
  STARTED+=("$SPID")
  probe=$(timeout 25 taskset -c "$CLIENT_CPU" "$LOAD" --probe --addr "127.0.0.1:$pg" --since-ns "$t0" --prefix "probe-$name-")
  if [[ $probe != *'"probe":"ok"'* ]]; then
    log "FAILED to start $name: $probe"; tail -20 "$OUT/logs/$name.log" >&2
    stop_pid "$SPID"; return 1
  fi
  STARTUP_MS=$(sed -E 's/.*"startup_ms":([0-9.]+).*/\1/' <<<"$probe")
  echo "$probe" | "$PY" "$HERE/jl.py" phase="$PHASE" round="$ROUND" server="$mode" case=startup \
    rss_kb="$(rss_kb "$SPID")" load1="$(load1)" >>"$RES"
  log "started $name ($mode, $conf) pid $SPID in ${STARTUP_MS} ms"
}

# ---- clients ------------------------------------------------------------------------------
# h2 CASE MODE PORT C M SECS BODYFILE [latlog]: h2load, one JSON record
h2() {
  local case=$1 mode=$2 port=$3 c=$4 m=$5 secs=$6 body=$7 latlog=${8:-}
  local tag l0 c0 rc0 t0 t1 c1 rc1 logarg=() logf=-
  tag="$PHASE-r$ROUND-$mode-$case"
  [ -n "$latlog" ] && { logf=$OUT/raw/$tag.reqlog; logarg=(--log-file="$logf"); }
  l0=$(load1); c0=$(cpu_ticks "$SPID"); rc0=$( [ -n "${REDIS_PID:-}" ] && cpu_ticks "$REDIS_PID" || echo 0); t0=$(now)
  timeout $(( secs + 40 )) taskset -c "$CLIENT_CPU" h2load -c "$c" -m "$m" -D "$secs" --warm-up-time 1 \
    -d "$body" -H 'content-type: application/grpc' -H 'te: trailers' "${logarg[@]}" \
    "http://127.0.0.1:$port$RPC_PATH" >"$OUT/raw/$tag.h2load.txt" 2>&1
  t1=$(now); c1=$(cpu_ticks "$SPID"); rc1=$( [ -n "${REDIS_PID:-}" ] && cpu_ticks "$REDIS_PID" || echo 0)
  "$PY" "$HERE/parse_h2load.py" "$OUT/raw/$tag.h2load.txt" "$logf" phase="$PHASE" round="$ROUND" \
    server="$mode" case="$case" c="$c" m="$m" load1="$l0" rss_kb="$(rss_kb "$SPID")" hwm_kb="$(hwm_kb "$SPID")" \
    server_cpu_util="$(awk -v a="$c0" -v b="$c1" -v t0="$t0" -v t1="$t1" -v k="$CLK_TCK" 'BEGIN{printf "%.3f", (b-a)/k/(t1-t0)}')" \
    redis_cpu_util="$(awk -v a="$rc0" -v b="$rc1" -v t0="$t0" -v t1="$t1" -v k="$CLK_TCK" 'BEGIN{printf "%.3f", (b-a)/k/(t1-t0)}')" \
    | tee -a "$RES" | cut -c1-400 >&2
  [ -n "$latlog" ] && gzip -f "$logf"
  return 0
}

# rls CASE MODE C M SECS KEYS PREFIX ADDR... : rlsload, one JSON record
rls() {
  local case=$1 mode=$2 c=$3 m=$4 secs=$5 keys=$6 prefix=$7; shift 7
  local addrs=() a l0 c0 rc0 t0 t1 c1 rc1 n=${RLS_N:-100000000}
  for a in "$@"; do addrs+=(--addr "$a"); done
  l0=$(load1); c0=$(cpu_ticks "$SPID"); rc0=$( [ -n "${REDIS_PID:-}" ] && cpu_ticks "$REDIS_PID" || echo 0); t0=$(now)
  timeout $(( secs + 60 )) taskset -c "$CLIENT_CPU" "$LOAD" "${addrs[@]}" -c "$c" -m "$m" -D "$secs" \
    --warmup "${RLS_WARMUP:-1}" -n "$n" --keys "$keys" --prefix "$prefix" --label "$case" \
    >"$OUT/raw/$PHASE-r$ROUND-$mode-$case.rlsload.txt" 2>&1
  t1=$(now); c1=$(cpu_ticks "$SPID"); rc1=$( [ -n "${REDIS_PID:-}" ] && cpu_ticks "$REDIS_PID" || echo 0)
  "$PY" "$HERE/jl.py" phase="$PHASE" round="$ROUND" server="$mode" case="$case" tool=rlsload load1="$l0" \
    rss_kb="$(rss_kb "$SPID")" hwm_kb="$(hwm_kb "$SPID")" \
    server_cpu_util="$(awk -v a="$c0" -v b="$c1" -v t0="$t0" -v t1="$t1" -v k="$CLK_TCK" 'BEGIN{printf "%.3f", (b-a)/k/(t1-t0)}')" \
    redis_cpu_util="$(awk -v a="$rc0" -v b="$rc1" -v t0="$t0" -v t1="$t1" -v k="$CLK_TCK" 'BEGIN{printf "%.3f", (b-a)/k/(t1-t0)}')" \
    <"$OUT/raw/$PHASE-r$ROUND-$mode-$case.rlsload.txt" | tee -a "$RES" | cut -c1-400 >&2
}

body_for() { # KEY_VALUE -> path of a gRPC-framed RateLimitRequest for it
  local f=$OUT/bodies/$1.bin
  [ -f "$f" ] || "$PY" "$HERE/gen_body.py" "$f" bench user "$1"
  echo "$f"
}

flush_redis() { [ -n "${REDIS_PID:-}" ] && redis-cli -p "$REDIS_PORT" flushall >/dev/null; }

# ---- suites -------------------------------------------------------------------------------
suite_allowed() { # MODE: allowed hot key (h2load), check, 1 in flight (h2load), many keys (rlsload)
  local mode=$1 key body
  key="hot-$PHASE-r$ROUND-$mode"
  launch "$PHASE-r$ROUND-$mode-allow" "$mode" allow "$G1" "$H1" || return 0
  body=$(body_for "$key")
  h2 hot_allowed "$mode" "$G1" 4 16 "$DUR" "$body"
  [ "$mode" = floor ] || RLS_WARMUP=0 rls check_allowed "$mode" 4 16 "$CHECK_DUR" 1 "$key" "127.0.0.1:$G1"
  h2 latency_1 "$mode" "$G1" 1 1 "$LAT_DUR" "$body" latlog
  rls many_keys "$mode" 4 16 "$DUR" "$MANY_KEYS" "mk-$PHASE-r$ROUND-$mode-" "127.0.0.1:$G1"
  echo "{\"phase\":\"$PHASE\",\"round\":$ROUND,\"server\":\"$mode\",\"case\":\"rss_after_allowed\",\"rss_kb\":$(rss_kb "$SPID"),\"hwm_kb\":$(hwm_kb "$SPID")}" >>"$RES"
  stop_pid "$SPID"
}

suite_denied() { # MODE: every request denied (limit 1 per hour, hot key)
  local mode=$1 key body
  key="deny-$PHASE-r$ROUND-$mode"
  launch "$PHASE-r$ROUND-$mode-deny" "$mode" deny "$G1" "$H1" || return 0
  body=$(body_for "$key")
  h2 hot_denied "$mode" "$G1" 4 16 "$DUR" "$body"
  [ "$mode" = floor ] || RLS_WARMUP=0 rls check_denied "$mode" 4 16 "$CHECK_DUR" 1 "$key" "127.0.0.1:$G1"
  stop_pid "$SPID"
}

rotate() { # ROUND ITEMS...: the items rotated left by ROUND-1
  local r=$1; shift; local a=("$@") n=$# i
  for i in $(seq 0 $(( n - 1 ))); do echo -n "${a[$(( (i + r - 1) % n ))]} "; done
}

start_redis() {
  REDIS_PID=
  port_free "$REDIS_PORT" || { log "redis port $REDIS_PORT busy"; return 1; }
  redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --save '' --appendonly no \
    >"$OUT/logs/redis.log" 2>&1 &
  REDIS_PID=$!
  STARTED+=("$REDIS_PID")
  local i
  for i in $(seq 1 100); do redis-cli -p "$REDIS_PORT" ping 2>/dev/null | grep -q PONG && break; sleep 0.1; done
  log "redis-server pid $REDIS_PID on $REDIS_PORT (unpinned): $(redis-cli -p "$REDIS_PORT" ping)"
}

# ---- phases -------------------------------------------------------------------------------
phase_verify() { # a real gRPC client (grpcio): limit 5 per hour -> 5 OK then OVER_LIMIT
  PHASE=verify ROUND=0
  local mode pydesc
  for mode in dl-mem lim-mem ${REDIS_PID:+dl-redis dl-lease lim-redis lim-cached}; do
    flush_redis
    launch "verify-$mode" "$mode" five "$G1" "$H1" || continue
    timeout 60 taskset -c "$CLIENT_CPU" "$PY" "$HERE/verify.py" "127.0.0.1:$G1" "five-$mode-$(date +%s)" 8 5 \
      >"$OUT/logs/verify-$mode.out" 2>&1
    local rc=$?
    cat "$OUT/logs/verify-$mode.out" >&2
    echo "{\"phase\":\"verify\",\"server\":\"$mode\",\"case\":\"five_then_over\",\"pass\":$([ $rc = 0 ] && echo true || echo false)}" >>"$RES"
    stop_pid "$SPID"
  done
}

phase_memory() {
  PHASE=memory
  local r m sides=(dl-mem lim-mem ${FLOOR_BIN:+floor})
  for r in $(seq 1 "$ROUNDS"); do
    ROUND=$r
    for m in $(rotate "$r" "${sides[@]}"); do suite_allowed "$m"; done
    for m in $(rotate "$r" "${sides[@]}"); do suite_denied "$m"; done
  done
}

phase_redis() {
  PHASE=redis
  local r m
  for r in $(seq 1 "$ROUNDS"); do
    ROUND=$r
    for m in $(rotate "$r" lim-redis dl-redis lim-cached dl-lease); do flush_redis; suite_allowed "$m"; done
    for m in $(rotate "$r" lim-redis dl-redis lim-cached dl-lease); do flush_redis; suite_denied "$m"; done
  done
}

scrape_both() { # MODE WHEN: both instances' /metrics (cumulative) -> logs and one summed record
  local f1=$OUT/logs/exact-r$ROUND-$1-a.$2.metrics f2=$OUT/logs/exact-r$ROUND-$1-b.$2.metrics
  curl -s --max-time 5 "http://127.0.0.1:$H1/metrics" >"$f1"
  curl -s --max-time 5 "http://127.0.0.1:$H2/metrics" >"$f2"
  "$PY" "$HERE/metrics_sum.py" "$f1" "$f2" | "$PY" "$HERE/jl.py" phase=exact round="$ROUND" server="$1" \
    case=exact_metrics after="$2" >>"$RES"
}

phase_exact() { # two instances of one kind on one Redis, limit $CAP per day, $EXACT_N requests
  PHASE=exact
  local r m p1 p2
  INSTANCES=2
  for r in $(seq 1 "$ROUNDS"); do
    ROUND=$r
    for m in $(rotate "$r" lim-redis dl-redis lim-cached dl-lease); do
      flush_redis
      launch "exact-r$r-$m-a" "$m" cap "$G1" "$H1" || continue
      p1=$SPID
      launch "exact-r$r-$m-b" "$m" cap "$G2" "$H2" || { stop_pid "$p1"; continue; }
      p2=$SPID
      # 8 connections (4 per instance) x 32 streams = 256 in flight on one key
      SPID=$p1 RLS_N=$EXACT_N RLS_WARMUP=0 rls exact_rust "$m" 8 32 90 1 "cap-r$r-$m" "127.0.0.1:$G1" "127.0.0.1:$G2"
      scrape_both "$m" after_rust
      if [ "$r" = 1 ]; then
        local l0; l0=$(load1)
        timeout 200 taskset -c "$CLIENT_CPU" "$PY" "$HERE/exact.py" "cappy-r$r-$m" "$EXACT_N" 32 150 \
          "127.0.0.1:$G1" "127.0.0.1:$G2" 2>"$OUT/logs/exact-py-$m.err" \
          | "$PY" "$HERE/jl.py" phase=exact round="$r" server="$m" case=exact_python load1="$l0" \
          | tee -a "$RES" | cut -c1-400 >&2
        scrape_both "$m" after_rust_and_python
      fi
      echo "{\"phase\":\"exact\",\"round\":$r,\"server\":\"$m\",\"case\":\"rss_two_instances\",\"rss_kb\":$(( $(rss_kb "$p1") + $(rss_kb "$p2") ))}" >>"$RES"
      stop_pid "$p1"; stop_pid "$p2"
    done
  done
  INSTANCES=1
}

REDIS_PID=
if [[ " $PHASES " == *" redis "* || " $PHASES " == *" exact "* ]]; then start_redis || exit 1; fi
PHASE=setup ROUND=0
for ph in $PHASES; do
  log "=== phase $ph (loadavg $(cat /proc/loadavg)) ==="
  "phase_$ph"
done
[ -n "${REDIS_PID:-}" ] && { echo "redis: $(redis-cli -p "$REDIS_PORT" info memory | grep used_memory_human)" >>"$OUT/meta.txt"; stop_pid "$REDIS_PID"; }
echo "loadavg at end: $(cat /proc/loadavg)" >>"$OUT/meta.txt"
"$PY" "$OWN/summarize.py" "$OUT" | tee "$OUT/summary.md"
log "done: $OUT"
