#!/usr/bin/env bash
# A sale start rehearsed in the deployment ops run, all on this machine: nginx on the shipped
# docker/nginx.conf (addresses replaced by local ports; the session service is a second nginx
# server that maps the `session` cookie to X-User-Id), three release gateways on one private
# Redis, `vq-sim record-backend` behind them, and `vq-sim simulate` through nginx.
# Each spike rate given is one run on a fresh Redis and fresh gateways; a table row per run.
# CONSOLE_SHOT=file.png takes a screenshot of the first gateway's operator console (headless
# chromium) CONSOLE_AT_S seconds into each run (the picture of docs/operations.md, The operator console).
# Usage: [SPIKE_S=10] [TAIL_RATE=0] [TAIL_S=0] [BATCH=500] [TICK_MS=1000] [MAX_S=40]
#        [SALES="limited-drop:1"] [POLL_S=seconds: ignore pollAfterSeconds] [OUT=target/sale]
#        [HB_S=60] [CONSOLE_SHOT=file.png] [CONSOLE_AT_S=20] benches/sale.sh [spike rate/s ...]
set -euo pipefail
cd "$(dirname "$0")/.."
RATES=("${@:-1000}")
SPIKE_S=${SPIKE_S:-10}
TAIL_RATE=${TAIL_RATE:-0}
TAIL_S=${TAIL_S:-0}
BATCH=${BATCH:-500}
TICK_MS=${TICK_MS:-1000}
MAX_S=${MAX_S:-40}
SALES=${SALES:-limited-drop:1}
OUT=${OUT:-target/sale}
CONSOLE_SHOT=${CONSOLE_SHOT:-}
CONSOLE_AT_S=${CONSOLE_AT_S:-20}
HB_S=${HB_S:-60}

source benches/lib.sh
need_tools nginx:nginx-light redis-server:redis-server redis-cli:redis-tools cmake:cmake python3:python3 curl:curl
cargo build --release -q
BIN=./target/release/vq-gateway
SIM=./target/release/vq-sim
NGINX=$(command -v nginx || echo /usr/sbin/nginx)
export VQ_TOKEN_SECRET="bench-secret-0123456789abcdefghijklmnop"
sale_args=()
for s in $SALES; do sale_args+=(--sale "$s"); done
if [ -n "${POLL_S:-}" ]; then sale_args+=(--poll-interval-s "$POLL_S"); fi

run() { # rate
  local rate=$1 dir="$OUT/$1" run_pids=() redis backend auth lb gws=() admins=()
  mkdir -p "$dir"
  redis=$(port)
  redis-server --port "$redis" --bind 127.0.0.1 --save "" --appendonly no --dir "$WORK" >/dev/null & run_pids+=($!)
  for _ in $(seq 100); do redis-cli -p "$redis" PING >/dev/null 2>&1 && break; sleep 0.05; done
  $SIM record-backend --listen 127.0.0.1:0 > "$WORK/backend.out" & run_pids+=($!)
  for _ in $(seq 100); do grep -q listening "$WORK/backend.out" 2>/dev/null && break; sleep 0.05; done
  backend=$(sed -n 's/^record-backend listening on //p' "$WORK/backend.out")
  for i in 1 2 3; do
    local gw admin
    gw=$(port); admin=$(port)
    cat > "$WORK/gw$i.toml" <<TOML
[server]
listen = "127.0.0.1:$gw"
admin_listen = "127.0.0.1:$admin"
threads = 1
log_format = "json"
[upstream]
address = "$backend"
[store]
backend = "redis"
redis_url = "redis://127.0.0.1:$redis"
[queue]
tick_ms = $TICK_MS
batch_size = $BATCH
heartbeat_timeout_s = $HB_S
max_capacity = 10000000
[flag]
enabled = true
TOML
    RUST_LOG=warn $BIN serve --config "$WORK/gw$i.toml" 2>"$dir/gateway-$i.log" & run_pids+=($!)
    for _ in $(seq 100); do curl -sf "127.0.0.1:$admin/readyz" >/dev/null 2>&1 && break; sleep 0.1; done
    gws+=("127.0.0.1:$gw")
    admins+=("127.0.0.1:$admin")
  done
  auth=$(port); lb=$(port)
  sed -e "s/gateway-1:8080/${gws[0]}/; s/gateway-2:8080/${gws[1]}/; s/gateway-3:8080/${gws[2]}/" \
      -e "s/server auth:8081;/server 127.0.0.1:$auth;/; s/listen 80;/listen 127.0.0.1:$lb;/" \
      -e "s/worker_processes auto;/worker_processes 1;/" docker/nginx.conf > "$WORK/nginx.conf"
  # The session service: the `session` cookie is the user id (no cookie: anonymous).
  python3 - "$WORK/nginx.conf" "$auth" <<'PY'
import sys
path, port = sys.argv[1], sys.argv[2]
conf = open(path).read().rstrip()
assert conf.endswith("}")
conf = conf[:-1] + f"""
    server {{
        listen 127.0.0.1:{port};
        location = /session {{
            add_header X-User-Id $cookie_session;
            return 200;
        }}
    }}
}}
"""
open(path, "w").write(conf)
PY
  "$NGINX" -c "$WORK/nginx.conf" -p "$WORK" -e "$WORK/nginx-error.log" -g "daemon off; pid $WORK/nginx.pid;" & run_pids+=($!)
  for _ in $(seq 100); do curl -s -o /dev/null "127.0.0.1:$lb/" && break; sleep 0.05; done
  if [ -n "$CONSOLE_SHOT" ]; then
    # The page reads the console state once loaded; the virtual time budget lets it draw.
    ( sleep "$CONSOLE_AT_S"; chromium --headless=new --no-sandbox --disable-gpu --hide-scrollbars \
        --user-data-dir="$WORK/chromium" --window-size=1280,1400 --virtual-time-budget=4000 \
        --screenshot="$(realpath -m "$CONSOLE_SHOT")" "http://${admins[0]}/console" >/dev/null 2>&1 ) & run_pids+=($!)
  fi
  $SIM simulate --url "http://127.0.0.1:$lb" "${sale_args[@]}" --spike-rate "$rate" --spike-s "$SPIKE_S" \
    --tail-rate "$TAIL_RATE" --tail-s "$TAIL_S" --batch "$BATCH" --tick-ms "$TICK_MS" \
    --heartbeat-timeout-s "$HB_S" --identity cookie:session --max-duration-s "$MAX_S" \
    --backend-record "http://$backend/_record" --out "$dir" > "$dir/summary.txt"
  cat "$dir/summary.txt" >&2
  python3 - "$dir/report.json" "$rate" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
e = r["endpoints"]
p95 = lambda op: e.get(op, {}).get("p95Ms", 0)
sales = r["backend"]["perSale"]
worst = max(s["maxPerTicks"][9] / (10 * s["budgetPerTick"]) for s in sales)
print(f"| {sys.argv[2]}/s | {r['spikeEnterRate']:.0f}/s | {p95('enter'):.0f} ms | {p95('poll'):.0f} ms | "
      f"{e.get('poll', {}).get('p99Ms', 0):.0f} ms | {r['errors']['fiveXx']} | {r['errors']['noAnswer']} | "
      f"{r['users']['arrived']} | {r['backend']['purchases']} | {worst:.2f} | "
      f"{r['etaError']['p50'] * 100:.0f} % | {r['backend']['lagTicks']} | {r['clientQueueMs']['p95']:.0f} ms |")
PY
  for p in "${run_pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait "${run_pids[@]}" 2>/dev/null || true
}

echo "| spike | enters achieved | enter p95 | poll p95 | poll p99 | 5xx | no answer | users | purchases | most in 10 ticks / budget | ETA error (median) | buyers late (ticks) | simulator queue p95 |"
echo "|---|---|---|---|---|---|---|---|---|---|---|---|---|"
for rate in "${RATES[@]}"; do run "$rate"; done
