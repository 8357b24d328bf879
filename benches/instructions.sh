#!/usr/bin/env bash
# Instructions per request, counted by callgrind: the bare Pingora proxy (benches/bare_proxy.rs)
# with the gateway's keep-alive idle bound (60 s) and without one (Pingora's default), and the
# gateway (memory store, single use off), 1 proxy thread each, the same nginx upstream,
# for passthrough GET and the gated POST with a valid entry token. User-space instructions only
# (the kernel's share is the same socket work in both), counted over a DUR-second wrk run after a
# warm-up and divided by the requests answered, so the figures do not move with the load of a
# shared box the way req/s does.
# With KEEP=DIR the callgrind files stay in DIR (bare-passthrough, gateway-gated, ...) for
# callgrind_annotate, and DIR/NAME.requests the requests each one counted.
# Usage: [KEEP=DIR] benches/instructions.sh [seconds per run, default 20]
set -euo pipefail
cd "$(dirname "$0")/.."
DUR=${1:-20}
CONNS=4
WRK_THREADS=1
GW_THREADS=1

source benches/lib.sh
need_tools wrk:wrk nginx:nginx-light valgrind:valgrind callgrind_control:valgrind cmake:cmake python3:python3 curl:curl
cargo build --release -q -p vq-gateway
BARE_BIN=$(bare_proxy_bin)

UP=$(port); BARE=$(port); BARE0=$(port)
nginx_upstream "$UP"
CG="valgrind --tool=callgrind --callgrind-out-file=$WORK/cg.%p"
$CG "$BARE_BIN" "127.0.0.1:$BARE" "127.0.0.1:$UP" 1 60 2>"$WORK/bare.log" & PIDS+=($!)
PID_bare=$!
$CG "$BARE_BIN" "127.0.0.1:$BARE0" "127.0.0.1:$UP" 1 0 2>"$WORK/bare0.log" & PIDS+=($!)
PID_bare0=$!
export VQ_TOKEN_SECRET="bench-secret-0123456789abcdefghijklmnop"
GW_WRAP=$CG GW_EXTRA=$'[token]\nsingle_use = false' start_gw gw memory ""
TOKEN=$(entry_token)
export TOKEN
for p in "$BARE" "$BARE0"; do
  for _ in $(seq 300); do curl -sf "127.0.0.1:$p/" >/dev/null 2>&1 && break; sleep 0.1; done
done

# count NAME PID URL [wrk args] — instructions per request of PID over one run of DUR seconds.
count() {
  local name=$1 pid=$2 url=$3; shift 3
  wrk -t1 -c"$CONNS" -d2s "$@" "$url" >/dev/null
  callgrind_control -z "$pid" >/dev/null 2>&1
  wrk -t1 -c"$CONNS" -d"${DUR}s" "$@" "$url" > "$WORK/wrk.out"
  local done
  done=$(sed -n 's/^ *\([0-9]*\) requests in.*/\1/p' "$WORK/wrk.out")
  grep -q "Non-2xx" "$WORK/wrk.out" && { echo "non-2xx answers: $(cat "$WORK/wrk.out")" >&2; exit 1; }
  rm -f "$WORK"/cg."$pid".*
  callgrind_control -d "$pid" >/dev/null 2>&1
  [ -z "${KEEP:-}" ] || { mkdir -p "$KEEP"; cat "$WORK"/cg."$pid".* > "$KEEP/$name"; echo "$done" > "$KEEP/$name.requests"; }
  local total=0 f
  for f in "$WORK"/cg."$pid".*; do
    total=$((total + $(sed -n 's/^totals: *\([0-9]*\).*/\1/p' "$f")))
  done
  echo $((total / done))
}

pass_b0=$(count bare0-passthrough "$PID_bare0" "http://127.0.0.1:$BARE0/static/x")
pass_b=$(count bare-passthrough "$PID_bare" "http://127.0.0.1:$BARE/static/x")
pass_g=$(count gateway-passthrough "$PID_gw" "http://127.0.0.1:$GW_gw/static/x")
gated_b0=$(count bare0-gated "$PID_bare0" "http://127.0.0.1:$BARE0/limited-drops/42/orders" -s benches/wrk/gated.lua)
gated_b=$(count bare-gated "$PID_bare" "http://127.0.0.1:$BARE/limited-drops/42/orders" -s benches/wrk/gated.lua)
gated_g=$(count gateway-gated "$PID_gw" "http://127.0.0.1:$GW_gw/limited-drops/42/orders" -s benches/wrk/gated.lua)
python3 - "$pass_b0" "$pass_b" "$pass_g" "$gated_b0" "$gated_b" "$gated_g" <<'PY'
import sys
pb0, pb, pg, gb0, gb, gg = map(int, sys.argv[1:])
print("| route | bare Pingora proxy, no idle bound | bare, 60 s idle bound (the reference) | gateway | gateway / bare with the bound | gateway / bare without |")
print("|---|---|---|---|---|---|")
print(f"| passthrough GET | {pb0} | {pb} | {pg} | {pg / pb:.3f} | {pg / pb0:.3f} |")
print(f"| gated POST, valid token | {gb0} | {gb} | {gg} | {gg / gb:.3f} | {gg / gb0:.3f} |")
PY
