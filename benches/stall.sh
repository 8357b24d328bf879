#!/usr/bin/env bash
# Redis stalls under full load, release build: one gateway (Redis store), wrk sending enters at
# full speed, Redis frozen with SIGSTOP for each given duration and resumed. Samples the gateway's
# `virtual_queue_store_degraded` gauge every 20 ms and prints, per stall, how long degraded mode
# lasted after Redis resumed, and the enter answers by kind during the run.
# Usage: benches/stall.sh [stall ms ...]   (default: 200 1000 3000)
set -euo pipefail
cd "$(dirname "$0")/.."
STALLS=("$@"); [ ${#STALLS[@]} -gt 0 ] || STALLS=(200 1000 3000)

source benches/lib.sh
need_tools wrk:wrk redis-server:redis-server cmake:cmake python3:python3 curl:curl
cargo build --release -q -p vq-gateway

UP=$(port); GW=$(port); ADMIN=$(port); RP=$(port)

python3 -m http.server "$UP" --bind 127.0.0.1 >/dev/null 2>&1 & PIDS+=($!)
redis-server --port "$RP" --bind 127.0.0.1 --save "" --appendonly no --dir "$WORK" >/dev/null & RPID=$!; PIDS+=($RPID)
cat > "$WORK/gw.toml" <<TOML
[server]
listen = "127.0.0.1:$GW"
admin_listen = "127.0.0.1:$ADMIN"
threads = 2
log_format = "json"
[upstream]
address = "127.0.0.1:$UP"
[store]
backend = "redis"
redis_url = "redis://127.0.0.1:$RP"
[queue]
max_capacity = 10000000
[flag]
enabled = true
TOML
VQ_TOKEN_SECRET=bench-secret-0123456789abcdef0123456789 RUST_LOG=warn \
  target/release/vq-gateway serve --config "$WORK/gw.toml" 2>"$WORK/gw.log" & PIDS+=($!)
for _ in $(seq 100); do curl -sf "127.0.0.1:$ADMIN/readyz" >/dev/null && break; sleep 0.1; done

total=2; for s in "${STALLS[@]}"; do total=$((total + s / 1000 + 4)); done
wrk -t2 -c64 -d"${total}s" -s benches/wrk/enter.lua "http://127.0.0.1:$GW" > "$WORK/wrk.txt" &
WRK=$!

sample() {  # prints "epoch_ms degraded" every 20 ms until killed
  while true; do
    d=$(curl -s "127.0.0.1:$ADMIN/metrics" | awk '/^virtual_queue_store_degraded /{print $2}')
    echo "$(date +%s%3N) ${d:-?}"
    sleep 0.02
  done
}
sample > "$WORK/samples.txt" & SAMPLER=$!; PIDS+=($SAMPLER)

sleep 2
: > "$WORK/stalls.txt"
for s in "${STALLS[@]}"; do
  kill -STOP "$RPID"; from=$(date +%s%3N)
  sleep "$(python3 -c "print($s/1000)")"
  kill -CONT "$RPID"; back=$(date +%s%3N)
  echo "$s $from $back" >> "$WORK/stalls.txt"
  sleep 4
done
wait "$WRK" || true
kill "$SAMPLER" 2>/dev/null || true
degraded_total=$(curl -s "127.0.0.1:$ADMIN/metrics" | awk '/^virtual_queue_failopen_answers_total/{print}')

python3 - "$WORK/samples.txt" "$WORK/stalls.txt" <<'PY'
import sys
samples = [l.split() for l in open(sys.argv[1]) if len(l.split()) == 2]
samples = [(int(t), d) for t, d in samples]
print("| stall | degraded during the stall | degraded mode ended after resume |")
print("|---|---|---|")
for line in open(sys.argv[2]):
    s, frm, back = map(int, line.split())
    seen = any(d == "1" for t, d in samples if frm <= t <= back)
    after = [(t, d) for t, d in samples if back <= t <= back + 4000]
    last = max((t for t, d in after if d == "1"), default=None)
    ended = "at once (not degraded after resume)" if last is None else f"{last - back + 20} ms"
    print(f"| {s} ms | {'yes' if seen else 'no'} | {ended} |")
PY
echo
echo "wrk (enters during the whole run):"; grep -E "Requests/sec|Non-2xx|requests in" "$WORK/wrk.txt" || true
echo "fail-open answers by outcome:"; echo "$degraded_total"
