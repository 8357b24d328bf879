#!/usr/bin/env bash
# Where the gateway's CPU goes on the hot paths: `perf record` of the release gateway (2 proxy
# threads, Redis store) while wrk drives one workload, then a flamegraph (inferno) and the top
# symbols by self time. Workloads: enter-new (first entries), enter (random users), poll, gated
# (a token-checked POST proxied to the upstream), passthrough. The Redis server can be profiled
# instead with TARGET=redis (by default under the queue workloads only: gated and passthrough
# requests do not reach Redis).
# Usage: [TARGET=gateway|redis] benches/profile.sh [seconds, default 5] [workload ...]
# Writes benches/profiles/<target>-<workload>.svg and .txt (top 30 self-time symbols).
set -euo pipefail
cd "$(dirname "$0")/.."
DUR=${1:-5}
shift || true
TARGET=${TARGET:-gateway}
DEFAULT_WORKLOADS="enter-new enter poll gated passthrough"
[ "$TARGET" = redis ] && DEFAULT_WORKLOADS="enter-new enter poll"
WORKLOADS=("${@:-$DEFAULT_WORKLOADS}")
read -r -a WORKLOADS <<<"${WORKLOADS[*]}"
CONNS=64
GW_THREADS=2
WRK_THREADS=2

source benches/lib.sh
need_tools wrk:wrk nginx:nginx-light redis-server:redis-server perf:linux-perf cmake:cmake python3:python3 curl:curl
command -v inferno-flamegraph >/dev/null || cargo install -q inferno
cargo build --release -q -p vq-gateway
mkdir -p benches/profiles

UP=$(port); RP=$(port)
redis-server --port "$RP" --bind 127.0.0.1 --save "" --appendonly no --dir "$WORK" >/dev/null & PIDS+=($!)
REDIS_PID=$!
nginx_upstream "$UP"
export VQ_TOKEN_SECRET="bench-secret-0123456789abcdefghijklmnop"
GW_EXTRA=$'[token]\nsingle_use = false' start_gw gw redis "redis://127.0.0.1:$RP"
TOKEN=$(entry_token)
export TOKEN
# Polls find waiting users: random users of 1..100000 enter first (most are drawn).
wrk -t2 -c64 -d6s -s benches/wrk/enter.lua "http://127.0.0.1:$GW_gw/virtual-queues/limited-drop/42/entries" >/dev/null

pid=$PID_gw
[ "$TARGET" = redis ] && pid=$REDIS_PID
for w in "${WORKLOADS[@]}"; do
  case $w in
    enter-new) args=(-s benches/wrk/enter_new.lua "http://127.0.0.1:$GW_gw/virtual-queues/limited-drop/42/entries") ;;
    enter) args=(-s benches/wrk/enter.lua "http://127.0.0.1:$GW_gw/virtual-queues/limited-drop/42/entries") ;;
    poll) args=(-s benches/wrk/poll.lua "http://127.0.0.1:$GW_gw/virtual-queues/limited-drop/42/entries/me") ;;
    gated) args=(-s benches/wrk/gated.lua "http://127.0.0.1:$GW_gw/limited-drops/42/orders") ;;
    passthrough) args=("http://127.0.0.1:$GW_gw/static/x") ;;
    *) echo "unknown workload $w" >&2; exit 2 ;;
  esac
  out="benches/profiles/$TARGET-$w"
  perf record -q -F 499 -g --call-graph dwarf,16384 -p "$pid" -o "$WORK/perf.data" -- sleep "$DUR" 2>/dev/null &
  rec=$!
  wrk -t"$WRK_THREADS" -c"$CONNS" -d"${DUR}s" "${args[@]}" | grep -E "Requests/sec|Non-2xx" | sed "s/^/$w: /" >&2
  wait "$rec" || true
  perf script -i "$WORK/perf.data" 2>/dev/null | inferno-collapse-perf > "$WORK/folded"
  inferno-flamegraph --minwidth 2 --title "$TARGET, $w ($(date -u +%Y-%m-%d))" < "$WORK/folded" > "$out.svg"
  perf report -i "$WORK/perf.data" --no-children --stdio --sort symbol --percent-limit 0.8 2>/dev/null |
    grep -E "^ +[0-9.]+%" | sed -E "s/ +- +- +$//" | head -30 > "$out.txt"
  echo "$out.svg, $out.txt" >&2
done
