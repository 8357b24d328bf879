# Shared by the bench scripts (sourced, from the repository root): tool installation, the work
# directory and process cleanup, free ports, and wrk's summary as one line.

# need_tools command:package ... — installs the Debian packages of the commands that are missing.
need_tools() {
  local need=() pair
  for pair in "$@"; do
    command -v "${pair%%:*}" >/dev/null || need+=("${pair#*:}")
  done
  if [ ${#need[@]} -gt 0 ]; then apt-get update -qq && apt-get install -y -qq "${need[@]}"; fi
}

# A private work directory; every pid pushed to PIDS is killed on exit. A script that pauses a
# process sets RPID so that it is resumed before being killed.
WORK=$(mktemp -d)
PIDS=()
cleanup() {
  kill -CONT "${RPID:-0}" 2>/dev/null || true
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT

port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# wrk_line URL [wrk args...] → "rps p50 p99 non2xx total" (latencies in ms), with
# WRK_THREADS, CONNS and DUR from the caller; wrk runs on the CPUs in WRK_CPUS when set.
wrk_line() {
  local url=$1; shift
  ${WRK_CPUS:+taskset -c "$WRK_CPUS"} wrk -t"$WRK_THREADS" -c"$CONNS" -d"${DUR}s" --latency "$@" "$url" > "$WORK/wrk.out" 2>&1
  python3 - "$WORK/wrk.out" <<'PY'
import re, sys
t = open(sys.argv[1]).read()
rps = float(re.search(r"Requests/sec:\s+([\d.]+)", t).group(1))
def ms(label):
    m = re.search(r"\s%s\s+([\d.]+)(us|ms|s)\b" % label, t)
    v, u = float(m.group(1)), m.group(2)
    return v / 1000 if u == "us" else v * 1000 if u == "s" else v
non2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", t)
total = re.search(r"(\d+) requests in", t).group(1)
print(f"{rps:.0f} {ms('50%'):.2f} {ms('99%'):.2f} {non2xx.group(1) if non2xx else 0} {total}")
PY
}

# start_gw NAME BACKEND REDIS_URL — a release gateway (GW_THREADS proxy threads, upstream on UP,
# a tick long enough that the pump never admits during a run) on free ports, with GW_EXTRA
# (TOML) appended when set, run under GW_WRAP (a command prefix, e.g. valgrind) when set; sets
# GW_<NAME> (its port) and PID_<NAME>.
start_gw() {
  local name=$1 backend=$2 url=$3 gw admin
  gw=$(port); admin=$(port)
  cat > "$WORK/$name.toml" <<TOML
[server]
listen = "127.0.0.1:$gw"
admin_listen = "127.0.0.1:$admin"
threads = $GW_THREADS
log_format = "json"
[upstream]
address = "127.0.0.1:$UP"
[store]
backend = "$backend"
redis_url = "$url"
[queue]
tick_ms = 3600000
max_capacity = 10000000
[flag]
enabled = true
${GW_EXTRA:-}
TOML
  RUST_LOG=error ${GW_WRAP:-} ./target/release/vq-gateway serve --config "$WORK/$name.toml" 2>"$WORK/$name.log" & PIDS+=($!)
  printf -v "PID_$name" '%s' "$!"
  for _ in $(seq 600); do curl -sf "127.0.0.1:$admin/readyz" >/dev/null 2>&1 && break; sleep 0.1; done
  printf -v "GW_$name" '%s' "$gw"
}

# cpu_ms PID — CPU time (user + system) the process has used so far, in ms.
CLK_TCK=$(getconf CLK_TCK)
cpu_ms() { awk -v hz="$CLK_TCK" '{ print int(($14 + $15) * 1000 / hz) }' "/proc/$1/stat"; }

# bare_proxy_bin — builds the bare Pingora proxy bench target (release) and prints its path.
bare_proxy_bin() {
  cargo bench --no-run --bench bare_proxy --message-format=json 2>/dev/null |
    python3 -c 'import json,sys
for l in sys.stdin:
    m = json.loads(l)
    if m.get("reason") == "compiler-artifact" and m["target"]["name"] == "bare_proxy" and m.get("executable"):
        print(m["executable"])'
}

# nginx_upstream PORT [HTTP_CONFIG] — nginx (1 worker) on PORT answering a small JSON body to every
# method, with HTTP_CONFIG (more servers) in the same http block.
nginx_upstream() {
  mkdir -p "$WORK/nginx"
  cat > "$WORK/nginx/nginx.conf" <<NGINX
worker_processes 1;
pid $WORK/nginx/nginx.pid;
error_log $WORK/nginx/error.log;
events { worker_connections 4096; }
http {
  access_log off;
  server { listen 127.0.0.1:$1; location / { return 200 '{"ok":true}'; } }
  ${2:-}
}
NGINX
  nginx -c "$WORK/nginx/nginx.conf" -g 'daemon off;' & PIDS+=($!)
}

# entry_token — a valid entry token of user 1001 for LIMITED_DROP 42, signed with
# VQ_TOKEN_SECRET, expiring in 280 s.
entry_token() {
  python3 - <<PY
import base64, hashlib, hmac, time
p = "LIMITED_DROP|42|1001|%d" % (time.time() + 280)
b = lambda x: base64.urlsafe_b64encode(x).rstrip(b"=").decode()
print(b(p.encode()) + "." + b(hmac.new(b"$VQ_TOKEN_SECRET", p.encode(), hashlib.sha256).digest()))
PY
}
