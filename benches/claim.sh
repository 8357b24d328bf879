#!/usr/bin/env bash
# The store's limit for the gate's single-use claims: redis-benchmark running the scripts the
# gate runs per purchase on one Redis, each on random token ids (__rand_int__), side by side in
# one run: the claim of the version before (setnx.lua: one SET NX per purchase), and this
# version's claim.lua take, then the settle that follows it (spend). A purchase now costs a take
# and a settle: two calls instead of one; this shows what each costs Redis.
# Usage: [N=200000] [CLIENTS=50] [PIPELINE=1] benches/claim.sh
set -euo pipefail
cd "$(dirname "$0")/.."
source benches/lib.sh
need_tools redis-server:redis-server redis-benchmark:redis-tools python3:python3

N=${N:-200000}
CLIENTS=${CLIENTS:-50}
RP=$(port)
redis-server --port "$RP" --save '' --appendonly no --dir "$WORK" >/dev/null &
PIDS+=($!)
for _ in $(seq 50); do redis-cli -p "$RP" ping >/dev/null 2>&1 && break; sleep 0.1; done

load() { redis-cli -p "$RP" SCRIPT LOAD "$(cat "lua/$1.lua")"; }
SETNX=$(load setnx)
CLAIM=$(load claim)
K='queue:{LIMITED_DROP:42}:used:'

bench() {
  redis-benchmark -p "$RP" -n "$N" -c "$CLIENTS" -P "${PIPELINE:-1}" -r 100000000 -q "$@" |
    python3 -c 'import re,sys; t=sys.stdin.read(); print(re.findall(r"([\d.]+) requests per second", t)[-1])'
}

old=$(bench EVALSHA "$SETNX" 1 "${K}__rand_int__" owner 300000)
take=$(bench EVALSHA "$CLAIM" 1 "${K}__rand_int__" take owner 300000 5000 10)
spend=$(bench EVALSHA "$CLAIM" 1 "${K}__rand_int__" spend owner 300000 5000 10)
python3 - "$old" "$take" "$spend" <<'PY'
import sys
old, take, spend = map(float, sys.argv[1:])
both = 1 / (1 / take + 1 / spend)
print("| call | calls/s | of setnx.lua |")
print("|---|---|---|")
print(f"| setnx.lua (the claim before) | {old:,.0f} | 1.00 |")
print(f"| claim.lua take | {take:,.0f} | {take / old:.2f} |")
print(f"| claim.lua spend | {spend:,.0f} | {spend / old:.2f} |")
print(f"| a purchase now (take + spend) | {both:,.0f} | {both / old:.2f} |")
PY
