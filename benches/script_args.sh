#!/usr/bin/env bash
# The KEYS and ARGV the gateway passes to a queue script for one user, for redis-benchmark
# (__rand_int__ is its random user). Usage: benches/script_args.sh enter|poll KEY_PREFIX
K=$2
KEYS7="${K}waiting ${K}queued ${K}seq ${K}admitted_count ${K}seqtime ${K}waits ${K}advances"
NOW=1800000000000
ALIVE="${K}alive:$((NOW / 15000))"
case $1 in
  enter) echo "8 $KEYS7 $ALIVE $NOW 10000000 1800000 210000 __rand_int__" ;;
  poll)  echo "3 ${K}waiting ${K}admitted_count $ALIVE __rand_int__" ;;
  *) echo "unknown script $1" >&2; exit 64 ;;
esac
