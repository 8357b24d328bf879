#!/usr/bin/env bash
# Side-by-side benchmarks on this machine, release build, real load (wrk), against the references:
#   proxy + gate  vs  a bare Pingora proxy (benches/bare_proxy.rs: same threads, same upstream,
#                     the framework's ceiling) and nginx proxy_pass to the same upstream (context)
#   queue API     vs  redis-benchmark running the same Lua script (EVALSHA) on the same Redis
# Prints a Markdown table with ratios. Everything listens on 127.0.0.1 ports picked here and is
# stopped on exit. Usage: [ROUNDS=3] benches/run.sh [seconds per run, default 5]
set -euo pipefail
cd "$(dirname "$0")/.."
DUR=${1:-5}
CONNS=64
THREADS=2

source benches/lib.sh
need_tools wrk:wrk nginx:nginx-light redis-server:redis-server cmake:cmake python3:python3 curl:curl
cargo build --release -q -p vq-gateway
BARE_BIN=$(bare_proxy_bin)

UP=$(port); NGX=$(port); BARE=$(port); GW=$(port); ADMIN=$(port); RP=$(port)

# The upstream: nginx answering a small JSON body (fast enough not to be the bottleneck), and
# nginx proxy_pass to it on NGX (the context row).
nginx_upstream "$UP" "upstream backend { server 127.0.0.1:$UP; keepalive 128; }
  server {
    listen 127.0.0.1:$NGX;
    location / { proxy_pass http://backend; proxy_http_version 1.1; proxy_set_header Connection \"\"; }
  }"

# The bare Pingora proxy: the gateway's thread count (1), upstream peer options and keep-alive
# idle bound (60 s, the gateway's default).
"$BARE_BIN" "127.0.0.1:$BARE" "127.0.0.1:$UP" 1 60 2>"$WORK/bare.log" & PIDS+=($!)

redis-server --port "$RP" --bind 127.0.0.1 --save "" --appendonly no --dir "$WORK" >/dev/null & PIDS+=($!)

cat > "$WORK/gw.toml" <<TOML
[server]
listen = "127.0.0.1:$GW"
admin_listen = "127.0.0.1:$ADMIN"
threads = 1
log_format = "json"
[upstream]
address = "127.0.0.1:$UP"
[store]
backend = "redis"
redis_url = "redis://127.0.0.1:$RP"
[queue]
tick_ms = 3600000
max_capacity = 10000000
[token]
single_use = false
[flag]
enabled = true
TOML
export VQ_TOKEN_SECRET="bench-secret-0123456789abcdefghijklmnop"
RUST_LOG=error ./target/release/vq-gateway serve --config "$WORK/gw.toml" 2>"$WORK/gw.log" & PIDS+=($!)
for _ in $(seq 100); do curl -sf "127.0.0.1:$ADMIN/readyz" >/dev/null 2>&1 && break; sleep 0.1; done

TOKEN=$(entry_token)
export TOKEN

WRK_THREADS=$THREADS
run_wrk() { wrk_line "$@"; }

# redis-benchmark → rps (median of ROUNDS runs)
run_rb1() {
  redis-benchmark -p "$RP" -c $CONNS -n "$1" -r 100000 -q "${@:2}" 2>/dev/null | tr '\r' '\n' | grep -oE '[0-9.]+ requests per second' | tail -1 | cut -d' ' -f1
}
run_rb() {
  local v=()
  for _ in $(seq "${ROUNDS:-3}"); do v+=("$(run_rb1 "$@")"); done
  printf '%s\n' "${v[@]}" | sort -n | sed -n "$(( (${ROUNDS:-3} + 1) / 2 ))p"
}

ENTER_SHA=$(redis-cli -p "$RP" SCRIPT LOAD "$(cat lua/enter.lua)")
POLL_SHA=$(redis-cli -p "$RP" SCRIPT LOAD "$(cat lua/poll.lua)")
K='queue:{LIMITED_DROP:42}:'

echo "warming up..." >&2
wrk -t1 -c8 -d2s "http://127.0.0.1:$GW/products/1" >/dev/null
wrk -t1 -c8 -d2s "http://127.0.0.1:$NGX/products/1" >/dev/null
wrk -t1 -c8 -d2s "http://127.0.0.1:$BARE/products/1" >/dev/null

# Each pair runs ROUNDS times, alternating reference and gateway, and the median run (by req/s)
# of each side is reported: the shared cores make single runs swing by tens of percent.
ROUNDS=${ROUNDS:-3}
median_of() { # url [wrk args...] -> the median line of ROUNDS runs
  local lines=()
  for _ in $(seq "$ROUNDS"); do lines+=("$(run_wrk "$@")"); done
  printf '%s\n' "${lines[@]}" | sort -n | sed -n "$(( (ROUNDS + 1) / 2 ))p"
}
trio() { # path [wrk args...] -> "nginx line|bare line|gateway line", interleaved
  local ngx=() bare=() gw=()
  for _ in $(seq "$ROUNDS"); do
    ngx+=("$(run_wrk "http://127.0.0.1:$NGX$1" "${@:2}")")
    bare+=("$(run_wrk "http://127.0.0.1:$BARE$1" "${@:2}")")
    gw+=("$(run_wrk "http://127.0.0.1:$GW$1" "${@:2}")")
  done
  local mid=$(( (ROUNDS + 1) / 2 ))
  local med; med() { printf '%s\n' "$@" | sort -n | sed -n "${mid}p"; }
  echo "$(med "${ngx[@]}")|$(med "${bare[@]}")|$(med "${gw[@]}")"
}

IFS='|' read -r NL BL GWL <<<"$(trio /products/1)"
read -r n_rps n_p50 n_p99 _ _ <<<"$NL"; read -r b_rps b_p50 b_p99 _ _ <<<"$BL"
read -r g_rps g_p50 g_p99 g_bad _ <<<"$GWL"
IFS='|' read -r NL BL GWL <<<"$(trio /limited-drops/42/orders -s benches/wrk/gated.lua)"
read -r ng_rps ng_p50 ng_p99 _ _ <<<"$NL"; read -r bg_rps bg_p50 bg_p99 _ _ <<<"$BL"
read -r gg_rps gg_p50 gg_p99 gg_bad _ <<<"$GWL"
read -r ge_rps ge_p50 ge_p99 ge_bad ge_total <<<"$(median_of "http://127.0.0.1:$GW/virtual-queues/limited-drop/42/entries" -s benches/wrk/enter.lua)"
read -r gp_rps gp_p50 gp_p99 gp_bad gp_total <<<"$(median_of "http://127.0.0.1:$GW/virtual-queues/limited-drop/42/entries/me" -s benches/wrk/poll.lua)"
RB_N=$(python3 -c "print(max(50000, int($ge_rps * $DUR)))")
# shellcheck disable=SC2086
re_rps=$(run_rb "$RB_N" EVALSHA "$ENTER_SHA" $(bash benches/script_args.sh enter "$K"))
# shellcheck disable=SC2086
rp_rps=$(run_rb "$RB_N" EVALSHA "$POLL_SHA" $(bash benches/script_args.sh poll "$K"))
WAITING=$(redis-cli -p "$RP" ZCARD "${K}waiting")

ratio() { python3 -c "print(f'{$1 / $2:.2f}')"; }
cat <<TABLE
Measured $(date -u +%Y-%m-%d) on $(nproc) shared cores, load generator on the same cores; wrk -t$THREADS -c$CONNS -d${DUR}s,
redis-benchmark -c$CONNS unpipelined; median of $ROUNDS interleaved runs each. Gateway: release build, 1 proxy
thread, Redis store; bare Pingora proxy: 1 thread, same upstream; nginx: 1 worker.

| workload | reference | reference req/s | vq-gateway req/s | ratio | gateway p50 / p99 ms | reference p50 / p99 ms |
|---|---|---|---|---|---|---|
| passthrough GET | bare Pingora proxy | $b_rps | $g_rps | $(ratio "$g_rps" "$b_rps") | $g_p50 / $g_p99 | $b_p50 / $b_p99 |
| passthrough GET | nginx proxy_pass | $n_rps | $g_rps | $(ratio "$g_rps" "$n_rps") | $g_p50 / $g_p99 | $n_p50 / $n_p99 |
| gated POST, valid token | bare Pingora proxy (no check) | $bg_rps | $gg_rps | $(ratio "$gg_rps" "$bg_rps") | $gg_p50 / $gg_p99 | $bg_p50 / $bg_p99 |
| gated POST, valid token | nginx proxy_pass (no check) | $ng_rps | $gg_rps | $(ratio "$gg_rps" "$ng_rps") | $gg_p50 / $gg_p99 | $ng_p50 / $ng_p99 |
| queue enter (HTTP, random users) | redis-benchmark EVALSHA enter.lua | ${re_rps%.*} | $ge_rps | $(ratio "$ge_rps" "$re_rps") | $ge_p50 / $ge_p99 | – |
| queue poll (HTTP, random users) | redis-benchmark EVALSHA poll.lua | ${rp_rps%.*} | $gp_rps | $(ratio "$gp_rps" "$rp_rps") | $gp_p50 / $gp_p99 | – |

Non-2xx answers: passthrough $g_bad, gated $gg_bad, enter $ge_bad of $ge_total (all should be 0);
poll $gp_bad of $gp_total (404 NOT_IN_QUEUE for users the enter runs happened not to draw).
Users waiting after the runs: $WAITING.
TABLE
