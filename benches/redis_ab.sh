#!/usr/bin/env bash
# Two gateway binaries side by side on the Redis store (one Redis, the same upstream), with the
# memory store (binary A) as the ceiling: wrk runs against each in turn, round after round, and
# the medians and each round's B/A ratio are printed per workload. For changes too small for
# benches/queue.sh's spread: the pairs share a round, so the box's drift cancels.
# Usage: A=path/to/vq-gateway B=path/to/vq-gateway [ROUNDS=5] [CONNS=64] [WS="enter poll new"] \
#        benches/redis_ab.sh [seconds per run, default 5]
set -euo pipefail
cd "$(dirname "$0")/.."
DUR=${1:-5}
CONNS=${CONNS:-64}
ROUNDS=${ROUNDS:-5}
GW_THREADS=${THREADS:-2}
WRK_THREADS=2
: "${A:?A=binary}" "${B:?B=binary}"
A=$(realpath "$A"); B=$(realpath "$B")

source benches/lib.sh
need_tools wrk:wrk redis-server:redis-server python3:python3 curl:curl
UP=$(port); RP=$(port)
redis-server --port "$RP" --bind 127.0.0.1 --save "" --appendonly no --dir "$WORK" >/dev/null & PIDS+=($!)
python3 -m http.server "$UP" --bind 127.0.0.1 >/dev/null 2>&1 & PIDS+=($!)
export VQ_TOKEN_SECRET="bench-secret-0123456789abcdefghijklmnop"
# start_gw runs ./target/release/vq-gateway under GW_WRAP: this wrapper runs the binary given instead.
cat > "$WORK/as" <<'SH'
#!/usr/bin/env bash
bin=$1; shift 2; exec "$bin" "$@"
SH
chmod +x "$WORK/as"
GW_WRAP="$WORK/as $A" start_gw a redis "redis://127.0.0.1:$RP"
GW_WRAP="$WORK/as $B" start_gw b redis "redis://127.0.0.1:$RP"
GW_WRAP="$WORK/as $A" start_gw m memory "redis://127.0.0.1:$RP"
P=/virtual-queues/limited-drop/42/entries
for g in "$GW_a" "$GW_b" "$GW_m"; do
  wrk -t2 -c64 -d3s -s benches/wrk/enter.lua "http://127.0.0.1:$g$P" >/dev/null
done
echo "A=$A B=$B, wrk -t$WRK_THREADS -c$CONNS -d${DUR}s, $ROUNDS rounds, median req/s"
echo "| workload | A on Redis | B on Redis | memory (A) | B / A | A / memory | B / memory | B / A per round |"
echo "|---|---|---|---|---|---|---|---|"
for w in ${WS:-enter poll new}; do
  case $w in
    enter) S=benches/wrk/enter.lua; Q=$P ;;
    poll) S=benches/wrk/poll.lua; Q=$P/me ;;
    new) S=benches/wrk/enter_new.lua; Q=$P ;;
    *) echo "unknown workload $w" >&2; exit 64 ;;
  esac
  ra=(); rb=(); rm=()
  for _ in $(seq "$ROUNDS"); do
    ra+=("$(wrk_line "http://127.0.0.1:$GW_a$Q" -s "$S" | cut -d' ' -f1)")
    rb+=("$(wrk_line "http://127.0.0.1:$GW_b$Q" -s "$S" | cut -d' ' -f1)")
    rm+=("$(wrk_line "http://127.0.0.1:$GW_m$Q" -s "$S" | cut -d' ' -f1)")
  done
  python3 - "$w" "${ra[*]}" "${rb[*]}" "${rm[*]}" <<'PY'
import statistics as st, sys
w = sys.argv[1]
a, b, m = ([float(x) for x in arg.split()] for arg in sys.argv[2:5])
ma, mb, mm = st.median(a), st.median(b), st.median(m)
pairs = ", ".join(f"{y / x:.2f}" for x, y in zip(a, b))
print(f"| {w} | {ma:.0f} | {mb:.0f} | {mm:.0f} | {mb / ma:.3f} | {ma / mm:.2f} | {mb / mm:.2f} | {pairs} |")
PY
done
