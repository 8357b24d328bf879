#!/usr/bin/env bash
# Redis time of one queue-script call carrying a batch of users, as the gateway sends it when the
# calls of a target pile up (`src/store/redis/batch.rs`): redis-benchmark runs EVALSHA with USERS
# random users per call, and Redis' own `usec_per_call` of EVALSHA (INFO commandstats, the
# commands inside the script included) is reported. SCRIPT=enter (the default): first entries,
# a new user each. SCRIPT=poll: polls of users already waiting (100,000 users enter first, one
# call each, with this tree's enter.lua; a polled id is one of them). With REV, the script of
# that git revision runs too, alternately with this tree's, each on a target of its own for
# enters, on the same waiting room for polls. (Before 76b93ac for poll.lua and the commit after it
# for enter.lua, the scripts took each user's token key among their KEYS: such a revision's
# scripts do not run with the arguments passed here.)
# Usage: [SCRIPT=enter|poll] [USERS=13] [ROUNDS=3] [CALLS=20000] benches/script_batch.sh [REV]
set -euo pipefail
cd "$(dirname "$0")/.."
SCRIPT=${SCRIPT:-enter}
USERS=${USERS:-13}
ROUNDS=${ROUNDS:-3}
CALLS=${CALLS:-20000}
source benches/lib.sh
need_tools redis-server:redis-server redis-benchmark:redis-tools python3:python3
RP=$(port)
redis-server --port "$RP" --bind 127.0.0.1 --save "" --appendonly no --dir "$WORK" >/dev/null & PIDS+=($!)
for _ in $(seq 50); do redis-cli -p "$RP" PING >/dev/null 2>&1 && break; sleep 0.1; done

# args TAG — KEYS and ARGV of one call, as `TargetKeys::enter_keys` / `poll_keys` and the store
# send them (__rand_int__ is redis-benchmark's random user).
args() {
  local k="queue:{LIMITED_DROP:$1}:" i
  case $SCRIPT in
    enter)
      printf '%s' "8 ${k}waiting ${k}queued ${k}seq ${k}admitted_count ${k}seqtime ${k}waits ${k}advances ${k}sale"
      printf ' %s' 1800000000000 1800000 100 2000 100000000 60 ;;
    poll)
      printf '%s' "3 ${k}waiting ${k}admitted_count ${k}sale"
      printf ' %s' 1800000000000 15000 ;;
    *) echo "unknown SCRIPT $SCRIPT" >&2; exit 64 ;;
  esac
  for i in $(seq "$USERS"); do printf ' %s' "__rand_int__"; done
}
RANGE=1000000000
if [ "$SCRIPT" = poll ]; then
  # One waiting room of users 0..99999 that every poll round uses.
  RANGE=100000
  ENTER_SHA=$(redis-cli -p "$RP" SCRIPT LOAD "$(cat lua/enter.lua)")
  # shellcheck disable=SC2046
  redis-benchmark -p "$RP" -c 8 -n 400000 -r "$RANGE" -q EVALSHA "$ENTER_SHA" \
    $(bash benches/script_args.sh enter "queue:{LIMITED_DROP:1}:") >/dev/null 2>&1
  echo "waiting users: $(redis-cli -p "$RP" ZCARD "queue:{LIMITED_DROP:1}:waiting")" >&2
fi
# usec TAG SHA — Redis' time per EVALSHA over CALLS calls.
usec() {
  redis-cli -p "$RP" CONFIG RESETSTAT >/dev/null
  # shellcheck disable=SC2046
  redis-benchmark -p "$RP" -c 8 -n "$CALLS" -r "$RANGE" -q EVALSHA "$2" $(args "$1") >/dev/null 2>&1
  redis-cli -p "$RP" INFO commandstats | sed -n 's/^cmdstat_evalsha:.*usec_per_call=\([0-9.]*\).*/\1/p'
}
HEAD_SHA=$(redis-cli -p "$RP" SCRIPT LOAD "$(cat "lua/$SCRIPT.lua")")
[ -z "${1:-}" ] || REV_SHA=$(redis-cli -p "$RP" SCRIPT LOAD "$(git show "$1:lua/$SCRIPT.lua")")
# Enters: a target per round and script; polls: the one waiting room.
tag() { if [ "$SCRIPT" = poll ]; then echo 1; else echo "$1"; fi; }
what="$USERS first entries"; [ "$SCRIPT" = enter ] || what="polls of $USERS waiting users"
echo "| round | this tree: µs per EVALSHA of $what |${1:+ $1: µs per EVALSHA |}"
echo "|---|---|${1:+---|}"
for r in $(seq "$ROUNDS"); do
  line="| $r | $(usec "$(tag "t$r")" "$HEAD_SHA") |"
  [ -z "${1:-}" ] || line="$line $(usec "$(tag "r$r")" "$REV_SHA") |"
  echo "$line"
done
