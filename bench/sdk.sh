#!/usr/bin/env bash
# Calls/s at -c 16 through one meshd to an echo agent written in each SDK's
# language (the conformance agents: agents/example, sdk/typescript/examples/
# agent.mjs, sdk/python/examples/agent.py), all on one hub in one run, driven
# by meshctl bench (the Go client) with the agents interleaved ROUNDS times;
# then each SDK's own client (examples/bench.mjs, examples/bench.py) against
# the Go agent and against its own language's agent. Prints every run's
# calls/s and p50/p99; read the medians.
#
#   bench/sdk.sh [ROUNDS=3] [DURATION=5s]
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-3}
dur=${2:-5s}
py=${MESH_PYTHON:-/usr/bin/python3}
export OTEL_SDK_DISABLED=true # no trace export of the slowest calls
out=$(mktemp -d -t agentmesh-sdkbench.XXXXXX)
trap 'kill $(jobs -p) 2>/dev/null; wait 2>/dev/null; rm -rf "$out"' EXIT
go build -o "$out/" ./cmd/meshd ./cmd/meshctl
go build -o "$out/go-agent" ./agents/example
addr=127.0.0.1:${MESH_BENCH_PORT:-7791}
hub=ws://$addr/ws
"$out/meshd" --listen "$addr" --log-level warn 2>"$out/meshd.log" &
sleep 1
"$out/go-agent" --hub "$hub" --name b-go 2>"$out/go.log" &
node sdk/typescript/examples/agent.mjs --hub "$hub" --name b-ts 2>"$out/ts.log" &
"$py" sdk/python/examples/agent.py --hub "$hub" --name b-py 2>"$out/py.log" &
sleep 2
"$out/meshctl" --hub "$hub" agents -o table
params='{"data":"hello, mesh: a small JSON payload of about 100 bytes, the size of a typical tool call"}'
for r in $(seq "$rounds"); do
  for a in b-go b-ts b-py; do
    printf 'round %s  meshctl bench %-10s ' "$r" "$a.echo"
    "$out/meshctl" --hub "$hub" bench "$a.echo" "$params" -c 16 -d "$dur" -o json |
      node -e 'let s="";process.stdin.on("data",d=>s+=d).on("end",()=>{const j=JSON.parse(s);const e=Object.values(j.errorDistribution||{}).reduce((a,b)=>a+b,0);console.log(`${Math.round(j.rps)} calls/s  p50 ${j.latencies["50th"].toFixed(2)} ms  p99 ${j.latencies["99th"].toFixed(2)} ms  errors ${e}`)})'
  done
done
for a in b-go b-ts; do
  printf 'TypeScript client → %-8s ' "$a.echo"; node sdk/typescript/examples/bench.mjs --hub "$hub" -c 16 -d "$dur" "$a.echo" "$params"
done
for a in b-go b-py; do
  printf 'Python client     → %-8s ' "$a.echo"; "$py" sdk/python/examples/bench.py --hub "$hub" -c 16 -d "$dur" "$a.echo" "$params"
done
