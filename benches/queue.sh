#!/usr/bin/env bash
# The queue API's own cost, side by side in one run: the same gateway binary on the memory store
# (the ceiling) and on the Redis store, and redis-benchmark running the equivalent scripts on the
# same Redis (the store's limit). Also counts the Redis commands each HTTP call costs
# (INFO commandstats before and after). Release build, wrk, everything on 127.0.0.1.
# Usage: [ROUNDS=3] [THREADS=2] [CONNS=64] benches/queue.sh [seconds per run, default 5]
set -euo pipefail
cd "$(dirname "$0")/.."
DUR=${1:-5}
CONNS=${CONNS:-64}
ROUNDS=${ROUNDS:-3}
GW_THREADS=${THREADS:-2}

source benches/lib.sh
need_tools wrk:wrk redis-server:redis-server redis-benchmark:redis-tools cmake:cmake python3:python3 curl:curl
cargo build --release -q -p vq-gateway

UP=$(port); RP=$(port)

redis-server --port "$RP" --bind 127.0.0.1 --save "" --appendonly no --dir "$WORK" >/dev/null & PIDS+=($!)
REDIS_PID=$!
python3 -m http.server "$UP" --bind 127.0.0.1 >/dev/null 2>&1 & PIDS+=($!)
export VQ_TOKEN_SECRET="bench-secret-0123456789abcdefghijklmnop"

start_gw mem memory "redis://127.0.0.1:$RP"
start_gw redis redis "redis://127.0.0.1:$RP"

WRK_THREADS=2
run_wrk() { wrk_line "$1" -s "$2"; } # url script -> "rps p50 p99 non2xx total"
median() { sort -n | sed -n "$(( (ROUNDS + 1) / 2 ))p"; }
calls() { redis-cli -p "$RP" INFO commandstats | python3 -c '
import re, sys
n = 0
for line in sys.stdin:
    m = re.match(r"cmdstat_(\w+):calls=(\d+)", line)
    if m and m.group(1) not in ("info",):
        n += int(m.group(2))
print(n)'; }
# Commands executed inside scripts are counted per command by commandstats too (EVALSHA and
# each redis.call), so the delta over N HTTP calls is the Redis work per call.
per_call() { python3 -c "print(f'{($2 - $1) / max(1, $3):.1f}')"; }

echo "warming up..." >&2
wrk -t1 -c8 -d2s -s benches/wrk/enter.lua "http://127.0.0.1:$GW_mem/virtual-queues/limited-drop/42/entries" >/dev/null
wrk -t1 -c8 -d2s -s benches/wrk/enter.lua "http://127.0.0.1:$GW_redis/virtual-queues/limited-drop/42/entries" >/dev/null

# The share of the machine's CPU time left idle during a run (idle + iowait over all, /proc/stat).
cpu_idle() { awk '/^cpu / { print $5 + $6, $2 + $3 + $4 + $5 + $6 + $7 + $8 + $9 }' /proc/stat; }
idle_share() { python3 -c "a = '$1'.split(); b = '$2'.split(); print(f'{(int(b[0]) - int(a[0])) * 100 / max(1, int(b[1]) - int(a[1])):.0f}')"; }
# CPU per request (µs): what one process spent during a run, over the requests the run made.
us_per() { python3 -c "print(f'{($2 - $1) * 1000 / max(1, $3):.0f}')"; }
pair() { # path script -> "mem line|redis line|redis commands per call|CPU µs per call: gw mem|gw redis|redis|idle %: mem|redis"
  local mem=() red=() g_mem=() g_red=() r_red=() i_mem=() i_red=() c0 c1 a0 a1 b0 b1 line s0
  for _ in $(seq "$ROUNDS"); do
    a0=$(cpu_ms "$PID_mem"); s0=$(cpu_idle)
    line=$(run_wrk "http://127.0.0.1:$GW_mem$1" "$2")
    a1=$(cpu_ms "$PID_mem"); i_mem+=("$(idle_share "$s0" "$(cpu_idle)")")
    mem+=("$line"); g_mem+=("$(us_per "$a0" "$a1" "$(echo "$line" | cut -d' ' -f5)")")
    c0=$(calls); a0=$(cpu_ms "$PID_redis"); b0=$(cpu_ms "$REDIS_PID"); s0=$(cpu_idle)
    line=$(run_wrk "http://127.0.0.1:$GW_redis$1" "$2")
    c1=$(calls); a1=$(cpu_ms "$PID_redis"); b1=$(cpu_ms "$REDIS_PID")
    i_red+=("$(idle_share "$s0" "$(cpu_idle)")")
    red+=("$line")
    n=$(echo "$line" | cut -d' ' -f5)
    g_red+=("$(us_per "$a0" "$a1" "$n")"); r_red+=("$(us_per "$b0" "$b1" "$n")")
    PER=$(per_call "$c0" "$c1" "$n")
  done
  echo "$(printf '%s\n' "${mem[@]}" | median)|$(printf '%s\n' "${red[@]}" | median)|$PER|$(printf '%s\n' "${g_mem[@]}" | median)|$(printf '%s\n' "${g_red[@]}" | median)|$(printf '%s\n' "${r_red[@]}" | median)|$(printf '%s\n' "${i_mem[@]}" | median)|$(printf '%s\n' "${i_red[@]}" | median)"
}
IFS='|' read -r ME RE E_CMDS E_GM E_GR E_R E_IM E_IR <<<"$(pair /virtual-queues/limited-drop/42/entries benches/wrk/enter.lua)"
IFS='|' read -r MN RN N_CMDS N_GM N_GR N_R N_IM N_IR <<<"$(pair /virtual-queues/limited-drop/42/entries benches/wrk/enter_new.lua)"
IFS='|' read -r MP RPL P_CMDS P_GM P_GR P_R P_IM P_IR <<<"$(pair /virtual-queues/limited-drop/42/entries/me benches/wrk/poll.lua)"
read -r me_rps me_p50 me_p99 _ _ <<<"$ME"; read -r re_rps re_p50 re_p99 re_bad _ <<<"$RE"
read -r mn_rps mn_p50 mn_p99 _ _ <<<"$MN"; read -r rn_rps rn_p50 rn_p99 rn_bad _ <<<"$RN"
read -r mp_rps mp_p50 mp_p99 _ _ <<<"$MP"; read -r rp_rps rp_p50 rp_p99 _ rp_total <<<"$RPL"

# redis-benchmark on the same scripts, the same keys and arguments the gateway sends.
K='queue:{LIMITED_DROP:42}:'
ENTER_SHA=$(redis-cli -p "$RP" SCRIPT LOAD "$(cat lua/enter.lua)")
POLL_SHA=$(redis-cli -p "$RP" SCRIPT LOAD "$(cat lua/poll.lua)")
RANGE=100000
rb() { redis-benchmark -p "$RP" -c $CONNS -n "$1" -r "$RANGE" -q "${@:2}" 2>/dev/null | tr '\r' '\n' | grep -oE '[0-9.]+ requests per second' | tail -1 | cut -d' ' -f1 | cut -d. -f1; }
N=$(python3 -c "print(max(50000, int(max($re_rps, $rp_rps) * $DUR)))")
# shellcheck disable=SC2086
rb_enter=$(for _ in $(seq "$ROUNDS"); do rb "$N" EVALSHA "$ENTER_SHA" $(bash benches/script_args.sh enter "$K"); done | median)
# First entries: a user range far larger than the calls made.
# shellcheck disable=SC2086
rb_new=$(for _ in $(seq "$ROUNDS"); do RANGE=1000000000 rb "$N" EVALSHA "$ENTER_SHA" $(bash benches/script_args.sh enter "${K}new:"); done | median)
# shellcheck disable=SC2086
rb_poll=$(for _ in $(seq "$ROUNDS"); do rb "$N" EVALSHA "$POLL_SHA" $(bash benches/script_args.sh poll "$K"); done | median)

ratio() { python3 -c "print(f'{$1 / $2:.2f}')"; }
cat <<TABLE
Measured $(date -u +%Y-%m-%d) on $(nproc) shared cores, wrk -t2 -c$CONNS -d${DUR}s on the same cores, median of $ROUNDS
interleaved runs; gateways: release build, $GW_THREADS proxy threads each; redis-benchmark -c$CONNS unpipelined.

| workload | memory store req/s | Redis store req/s | Redis / memory | redis-benchmark (same script) req/s | Redis store / redis-benchmark | Redis commands per call (EVALSHA included) | Redis store p50 / p99 ms | memory p50 / p99 ms |
|---|---|---|---|---|---|---|---|---|
| enter, first entries | $mn_rps | $rn_rps | $(ratio "$rn_rps" "$mn_rps") | $rb_new | $(ratio "$rn_rps" "$rb_new") | $N_CMDS | $rn_p50 / $rn_p99 | $mn_p50 / $mn_p99 |
| enter, random users 1..100000 (re-entries dominate) | $me_rps | $re_rps | $(ratio "$re_rps" "$me_rps") | $rb_enter | $(ratio "$re_rps" "$rb_enter") | $E_CMDS | $re_p50 / $re_p99 | $me_p50 / $me_p99 |
| poll | $mp_rps | $rp_rps | $(ratio "$rp_rps" "$mp_rps") | $rb_poll | $(ratio "$rp_rps" "$rb_poll") | $P_CMDS | $rp_p50 / $rp_p99 | $mp_p50 / $mp_p99 |

CPU per request (µs, user + system, median run): where the cores go; and the share of the
machine's CPU time left idle during the runs (median, %): work waiting on a round trip.

| workload | gateway on the memory store | gateway on Redis | Redis server | gateway Redis / memory | idle %, memory store runs | idle %, Redis store runs |
|---|---|---|---|---|---|---|
| enter, first entries | $N_GM | $N_GR | $N_R | $(ratio "$N_GR" "$N_GM") | $N_IM | $N_IR |
| enter, random users | $E_GM | $E_GR | $E_R | $(ratio "$E_GR" "$E_GM") | $E_IM | $E_IR |
| poll | $P_GM | $P_GR | $P_R | $(ratio "$P_GR" "$P_GM") | $P_IM | $P_IR |
Non-2xx: enter $re_bad, first entries $rn_bad (both should be 0); polls of users the enter runs never drew answer 404.
TABLE
