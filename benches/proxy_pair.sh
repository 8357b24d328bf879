#!/usr/bin/env bash
# The gateway against the framework's ceiling, run by run: a bare Pingora proxy
# (benches/bare_proxy.rs) and the gateway, 1 proxy thread each, the same nginx upstream, measured
# alternately (bare, gateway) for passthrough GET and for the gated POST with a valid entry token,
# N rounds; prints each round's ratio and the median. Pairing each gateway run with the bare run
# just before it keeps the box's drift out of the ratio better than one median of each.
# Usage: [N=9] benches/proxy_pair.sh [seconds per run, default 3]
set -euo pipefail
cd "$(dirname "$0")/.."
DUR=${1:-3}
N=${N:-9}
CONNS=64
WRK_THREADS=2
GW_THREADS=1

source benches/lib.sh
need_tools wrk:wrk nginx:nginx-light redis-server:redis-server cmake:cmake python3:python3 curl:curl
cargo build --release -q
BARE_BIN=$(bare_proxy_bin)

UP=$(port); BARE=$(port); RP=$(port)
nginx_upstream "$UP"
redis-server --port "$RP" --bind 127.0.0.1 --save "" --appendonly no --dir "$WORK" >/dev/null & PIDS+=($!)
"$BARE_BIN" "127.0.0.1:$BARE" "127.0.0.1:$UP" 1 2>"$WORK/bare.log" & PIDS+=($!)
export VQ_TOKEN_SECRET="bench-secret-0123456789abcdefghijklmnop"
GW_EXTRA=$'[token]\nsingle_use = false' start_gw gw redis "redis://127.0.0.1:$RP"
TOKEN=$(entry_token)
export TOKEN
for _ in $(seq 30); do curl -sf "127.0.0.1:$BARE/" >/dev/null 2>&1 && break; sleep 0.1; done

echo "| round | passthrough: bare req/s | gateway req/s | ratio | gated POST: bare req/s | gateway req/s | ratio |"
echo "|---|---|---|---|---|---|---|"
for i in $(seq "$N"); do
  b=$(wrk_line "http://127.0.0.1:$BARE/static/x")
  g=$(wrk_line "http://127.0.0.1:$GW_gw/static/x")
  bg=$(wrk_line "http://127.0.0.1:$BARE/limited-drops/42/orders" -s benches/wrk/gated.lua)
  gg=$(wrk_line "http://127.0.0.1:$GW_gw/limited-drops/42/orders" -s benches/wrk/gated.lua)
  for line in "$g" "$gg"; do
    [ "$(echo "$line" | cut -d' ' -f4)" = 0 ] || { echo "non-2xx answers from the gateway: $line" >&2; exit 1; }
  done
  python3 -c "
b, g, bg, gg = (float(x.split()[0]) for x in ('$b', '$g', '$bg', '$gg'))
print(f'| $i | {b:.0f} | {g:.0f} | {g / b:.2f} | {bg:.0f} | {gg:.0f} | {gg / bg:.2f} |')"
done | tee "$WORK/rounds"
python3 - "$WORK/rounds" <<'PY'
import statistics, sys
rows = [l.split("|") for l in open(sys.argv[1])]
p = [float(r[4]) for r in rows]
g = [float(r[7]) for r in rows]
print(f"\nMedian of {len(rows)} paired rounds: passthrough {statistics.median(p):.2f}, "
      f"gated {statistics.median(g):.2f} of the bare Pingora proxy "
      f"(ranges {min(p):.2f}-{max(p):.2f} and {min(g):.2f}-{max(g):.2f}).")
PY
