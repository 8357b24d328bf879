#!/usr/bin/env bash
# The KEYS and ARGV the gateway passes to a queue script for one user, for redis-benchmark
# (__rand_int__ is its random user). Usage: benches/script_args.sh enter|poll KEY_PREFIX
K=$2
KEYS7="${K}waiting ${K}queued ${K}seq ${K}admitted_count ${K}seqtime ${K}waits ${K}advances"
NOW=1800000000000
# enter: KEYS7 and the sale; ARGV now, key TTL, then the defaults of a sale the first call creates
# (batchSize, tickMs, maxCapacity, heartbeatTimeoutS: 15 s heartbeat windows); poll: the sale's
# default window width.
case $1 in
  enter) echo "8 $KEYS7 ${K}sale $NOW 1800000 100 2000 10000000 60 __rand_int__" ;;
  poll)  echo "3 ${K}waiting ${K}admitted_count ${K}sale $NOW 15000 __rand_int__" ;;
  *) echo "unknown script $1" >&2; exit 64 ;;
esac
