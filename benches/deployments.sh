#!/usr/bin/env bash
# The queue API on each Redis deployment, side by side in one run: the same release binary on
# the memory store (the ceiling), a single Redis, a primary + replica watched by one Sentinel,
# and a 3-master Redis Cluster (one hot sale: its slot lives on one master). First-entry enters
# and polls with wrk, interleaved rounds, medians. Everything on 127.0.0.1 and the same cores.
# Usage: [ROUNDS=3] [THREADS=2] benches/deployments.sh [seconds per run, default 5]
set -euo pipefail
cd "$(dirname "$0")/.."
DUR=${1:-5}
CONNS=64
ROUNDS=${ROUNDS:-3}
GW_THREADS=${THREADS:-2}

source benches/lib.sh
need_tools wrk:wrk redis-server:redis-server redis-cli:redis-tools cmake:cmake python3:python3 curl:curl
cargo build --release -q -p vq-gateway

UP=$(port)
python3 -m http.server "$UP" --bind 127.0.0.1 >/dev/null 2>&1 & PIDS+=($!)
export VQ_TOKEN_SECRET="bench-secret-0123456789abcdefghijklmnop"

redis() { # port [args...]
  local p=$1; shift
  mkdir -p "$WORK/r$p"
  redis-server --port "$p" --bind 127.0.0.1 --save "" --appendonly no --dir "$WORK/r$p" "$@" >/dev/null & PIDS+=($!)
  for _ in $(seq 100); do redis-cli -p "$p" PING >/dev/null 2>&1 && break; sleep 0.05; done
}

SINGLE=$(port); redis "$SINGLE"
PRIMARY=$(port); REPLICA=$(port); SENT=$(port)
redis "$PRIMARY"; redis "$REPLICA" --replicaof 127.0.0.1 "$PRIMARY"
cat > "$WORK/sentinel.conf" <<CONF
port $SENT
bind 127.0.0.1
dir $WORK
sentinel monitor vq 127.0.0.1 $PRIMARY 1
sentinel down-after-milliseconds vq 5000
CONF
redis-server "$WORK/sentinel.conf" --sentinel >/dev/null & PIDS+=($!)
# A cluster node's bus listens on port + 10000: pick ports whose bus port exists and is free.
cport() { python3 -c '
import socket
while True:
    s = socket.socket(); s.bind(("127.0.0.1", 0)); p = s.getsockname()[1]
    if p > 55535: continue
    b = socket.socket()
    try:
        b.bind(("127.0.0.1", p + 10000)); print(p); break
    except OSError: pass
'; }
C1=$(cport); C2=$(cport); C3=$(cport)
for p in $C1 $C2 $C3; do redis "$p" --cluster-enabled yes --cluster-config-file nodes.conf; done
redis-cli --cluster create 127.0.0.1:$C1 127.0.0.1:$C2 127.0.0.1:$C3 --cluster-replicas 0 --cluster-yes >/dev/null
for _ in $(seq 100); do redis-cli -p "$C1" CLUSTER INFO | grep -q cluster_state:ok && break; sleep 0.1; done
for _ in $(seq 100); do redis-cli -p "$SENT" SENTINEL get-master-addr-by-name vq >/dev/null 2>&1 && break; sleep 0.1; done

start_gw memory memory "redis://127.0.0.1:$SINGLE"
start_gw single redis "redis://127.0.0.1:$SINGLE"
start_gw sentinel redis "redis-sentinel://127.0.0.1:$SENT?sentinelServiceName=vq"
start_gw cluster redis "redis-cluster://127.0.0.1:$C1?node=127.0.0.1:$C2&node=127.0.0.1:$C3"

WRK_THREADS=2
median() { sort -n | sed -n "$(( (ROUNDS + 1) / 2 ))p"; }
ENTER=/virtual-queues/limited-drop/42/entries
echo "warming up (users 1..100000 enter each store)..." >&2
for k in memory single sentinel cluster; do
  gw="GW_$k"
  wrk -t2 -c32 -d6s -s benches/wrk/enter_seq.lua "http://127.0.0.1:${!gw}$ENTER" >/dev/null
done

declare -A RESULTS
for r in $(seq "$ROUNDS"); do
  for k in memory single sentinel cluster; do
    gw="GW_$k"
    RESULTS[$k,enter,$r]=$(wrk_line "http://127.0.0.1:${!gw}$ENTER" -s benches/wrk/enter_new.lua)
    RESULTS[$k,poll,$r]=$(wrk_line "http://127.0.0.1:${!gw}$ENTER/me" -s benches/wrk/poll.lua)
  done
done
field() { for r in $(seq "$ROUNDS"); do echo "${RESULTS[$1,$2,$r]}" | cut -d' ' -f"$3"; done | median; }
ratio() { python3 -c "print(f'{$1 / $2:.2f}')"; }
cat <<TABLE
Measured $(date -u +%Y-%m-%d) on $(nproc) shared cores, wrk -t2 -c$CONNS -d${DUR}s on the same cores, median of $ROUNDS
interleaved rounds; gateways: release build, $GW_THREADS proxy threads each; one hot sale.

| store | enter (first entries) req/s | enter p99 ms | poll req/s | poll p99 ms | enter / single | poll / single |
|---|---|---|---|---|---|---|
TABLE
se=$(field single enter 1); sp=$(field single poll 1)
for k in memory single sentinel cluster; do
  e=$(field $k enter 1); p=$(field $k poll 1)
  echo "| $k | $e | $(field $k enter 3) | $p | $(field $k poll 3) | $(ratio "$e" "$se") | $(ratio "$p" "$sp") |"
done
bad=0
for k in single sentinel cluster; do for r in $(seq "$ROUNDS"); do
  n=$(echo "${RESULTS[$k,enter,$r]}" | cut -d' ' -f4); bad=$((bad + n))
done; done
echo
echo "Non-2xx enter answers on the Redis stores: $bad (should be 0); polls of users never entered answer 404."
