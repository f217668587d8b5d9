#!/usr/bin/env bash
# Checks meshctl bench against an outside tool on the hub's HTTP endpoint:
# TOOL=wrk (default) or TOOL=hey, both from Debian. Same method, same body,
# same concurrency, taking turns for ROUNDS rounds (default 5). It prints
# every round and the medians of requests/s, p50 and p99 with their ratios
# meshctl/TOOL: on a shared 2-core machine one round can swing by ±20 %, so
# the medians are what to compare.
#
# wrk is the default because its latencies are exact to the microsecond
# (HdrHistogram); hey prints every latency rounded to 0.1 ms, which at
# c=16 (p50 ≈ 0.5 ms) is a 20 % step, too coarse to judge a 10 % bound.
# wrk runs for a duration (D, default 3s), hey for N calls (default 20000).
# Requires: apt-get install -y wrk hey.
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${ROUNDS:-5}
tool=${TOOL:-wrk}
n=${N:-20000}
d=${D:-3s}
c=${C:-16}
bin=$(mktemp -d); trap 'kill $pid 2>/dev/null || true; rm -rf "$bin"' EXIT
go build -o "$bin" ./cmd/meshd ./cmd/meshctl
addr=127.0.0.1:$((20000 + RANDOM % 10000))
# The hub gets CPU 0 and each load generator CPU 1 (PIN=0 turns this
# off): on 2 shared cores a generator that itself burns more CPU would
# otherwise take it from the hub and measure a slower hub, not measure it
# wrongly. Pinned, both tools load the same hub the same way.
pin_hub=() pin_gen=()
if [ "${PIN:-1}" = 1 ] && [ "$(nproc)" -ge 2 ]; then pin_hub=(taskset -c 0) pin_gen=(taskset -c 1); fi
"${pin_hub[@]}" "$bin/meshd" --demo --listen "$addr" --log-level warn & pid=$!
for _ in $(seq 50); do curl -sf "http://$addr/readyz" >/dev/null && break; sleep 0.1; done
body='{"jsonrpc":"2.0","id":1,"method":"echo.echo","params":{"data":"hello"}}'
lua="$bin/post.lua"
printf 'wrk.method = "POST"\nwrk.body = %s\nwrk.headers["Content-Type"] = "application/json"\n' "'$body'" >"$lua"
# warm both paths up
case $tool in
wrk) wrk -t1 -c"$c" -d1s -s "$lua" "http://$addr/rpc" >/dev/null ;;
hey) hey -n 2000 -c "$c" -m POST -T application/json -d "$body" "http://$addr/rpc" >/dev/null ;;
*) echo "TOOL must be wrk or hey" >&2; exit 2 ;;
esac
"$bin/meshctl" bench echo.echo '{"data":"hello"}' -n 2000 -c "$c" --hub "http://$addr/rpc" >/dev/null
out=$(mktemp)
# Both tools print "TOOL ROUND RPS P50_MS P99_MS" lines into $out.
run_wrk() {
  "${pin_gen[@]}" wrk -t1 -c"$c" -d"$d" --latency -s "$lua" "http://$addr/rpc" |
    awk -v r="$1" 'function ms(v) { if (v ~ /us$/) return v / 1000; if (v ~ /ms$/) return v + 0; if (v ~ /s$/) return v * 1000; return v }
      /Requests\/sec/ {rps=$2} /^ +50%/ {p50=ms($2)} /^ +99%/ {p99=ms($2)} /Non-2xx|Socket errors/ {print "wrk: " $0 > "/dev/stderr"}
      END {printf "tool %s %f %f %f\n", r, rps, p50, p99}' >>"$out"
}
run_hey() {
  "${pin_gen[@]}" hey -n "$n" -c "$c" -m POST -T application/json -d "$body" "http://$addr/rpc" |
    awk -v r="$1" '/Requests\/sec/ {rps=$2} /  50% in/ {p50=$3*1000} /  99% in/ {p99=$3*1000}
      END {printf "tool %s %f %f %f\n", r, rps, p50, p99}' >>"$out"
}
run_meshctl() {
  # The report goes to a file and is read afterwards: python3 started at
  # the head of a pipe burns ~0.4 s of CPU (pyenv's shim) while the load
  # runs, which on 2 cores took 20 % off meshctl's figure.
  if [ "$tool" = wrk ]; then amount=(-d "$d"); else amount=(-n "$n"); fi
  "${pin_gen[@]}" "$bin/meshctl" bench echo.echo '{"data":"hello"}' "${amount[@]}" -c "$c" --hub "http://$addr/rpc" -o json >"$bin/report.json"
  python3 -c "import json,sys; d=json.load(open('$bin/report.json')); l=d['latencies']; print('meshctl $1', d['rps'], l['50th'], l['99th'])" >>"$out"
}
# ABBA order: the outside tool first in odd rounds, meshctl first in even ones, so that
# neither always runs on the hub the other has just warmed or loaded.
for i in $(seq "$rounds"); do
  if [ $((i % 2)) = 1 ]; then "run_$tool" "$i"; run_meshctl "$i"; else run_meshctl "$i"; "run_$tool" "$i"; fi
done
python3 - "$out" "$tool" <<'PY'
import sys, statistics as st
rows = [l.split() for l in open(sys.argv[1])]
name = sys.argv[2]
by = {"tool": [], "meshctl": []}
for tool, r, rps, p50, p99 in rows:
    by[tool].append((float(rps), float(p50), float(p99)))
for i, (h, m) in enumerate(zip(by["tool"], by["meshctl"]), 1):
    print(f"round {i}: {name} {h[0]:7.0f}/s p50 {h[1]:.3f} ms p99 {h[2]:.3f} ms | meshctl {m[0]:7.0f}/s p50 {m[1]:.3f} ms p99 {m[2]:.3f} ms | rps ratio {m[0]/h[0]:.3f}")
med = {t: [st.median(x[k] for x in v) for k in range(3)] for t, v in by.items()}
h, m = med["tool"], med["meshctl"]
print(f"median: {name} {h[0]:.0f}/s p50 {h[1]:.3f} ms p99 {h[2]:.3f} ms | meshctl {m[0]:.0f}/s p50 {m[1]:.3f} ms p99 {m[2]:.3f} ms")
print(f"meshctl/{name} (medians): rps {m[0]/h[0]:.3f}, p50 {m[1]/h[1]:.3f}, p99 {m[2]/h[2]:.3f}")
PY
rm -f "$out"
