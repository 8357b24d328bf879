#!/usr/bin/env bash
# Redis time of one enter.lua call carrying a batch of first entries, as the gateway sends it
# when the enters of a target pile up (`src/store/redis/batch.rs`): redis-benchmark runs EVALSHA
# with USERS random new users per call, and Redis' own `usec_per_call` of EVALSHA (INFO
# commandstats, the commands inside the script included) is reported. With REV, the enter.lua of
# that git revision runs too, alternately with this tree's, each on a target of its own.
# Usage: [USERS=13] [ROUNDS=3] [CALLS=20000] benches/script_batch.sh [REV]
set -euo pipefail
cd "$(dirname "$0")/.."
USERS=${USERS:-13}
ROUNDS=${ROUNDS:-3}
CALLS=${CALLS:-20000}
source benches/lib.sh
need_tools redis-server:redis-server redis-benchmark:redis-tools python3:python3
RP=$(port)
redis-server --port "$RP" --bind 127.0.0.1 --save "" --appendonly no --dir "$WORK" >/dev/null & PIDS+=($!)
for _ in $(seq 50); do redis-cli -p "$RP" PING >/dev/null 2>&1 && break; sleep 0.1; done

# args TAG — KEYS and ARGV of one call, as `TargetKeys::enter_keys` and the store send them.
args() {
  local k="queue:{LIMITED_DROP:$1}:" i
  printf '%s' "$((8 + USERS)) ${k}waiting ${k}queued ${k}seq ${k}admitted_count ${k}seqtime ${k}waits ${k}advances ${k}alive:120000"
  for i in $(seq "$USERS"); do printf ' %s' "${k}token:__rand_int__"; done
  printf ' %s' 1800000000000 100000000 1800000 210000
  for i in $(seq "$USERS"); do printf ' %s' "__rand_int__"; done
}
# usec TAG SHA — Redis' time per EVALSHA over CALLS calls.
usec() {
  redis-cli -p "$RP" CONFIG RESETSTAT >/dev/null
  # shellcheck disable=SC2046
  redis-benchmark -p "$RP" -c 8 -n "$CALLS" -r 1000000000 -q EVALSHA "$2" $(args "$1") >/dev/null 2>&1
  redis-cli -p "$RP" INFO commandstats | sed -n 's/^cmdstat_evalsha:.*usec_per_call=\([0-9.]*\).*/\1/p'
}
HEAD_SHA=$(redis-cli -p "$RP" SCRIPT LOAD "$(cat lua/enter.lua)")
[ -z "${1:-}" ] || REV_SHA=$(redis-cli -p "$RP" SCRIPT LOAD "$(git show "$1:lua/enter.lua")")
echo "| round | this tree: µs per EVALSHA of $USERS first entries |${1:+ $1: µs per EVALSHA |}"
echo "|---|---|${1:+---|}"
for r in $(seq "$ROUNDS"); do
  line="| $r | $(usec "t$r" "$HEAD_SHA") |"
  [ -z "${1:-}" ] || line="$line $(usec "r$r" "$REV_SHA") |"
  echo "$line"
done
