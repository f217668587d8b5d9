#!/usr/bin/env bash
# Checks meshctl bench against an outside tool (hey, from Debian) on the
# hub's HTTP endpoint: same method, same body, same concurrency, taking
# turns. Requires: apt-get install -y hey.
set -euo pipefail
cd "$(dirname "$0")/.."
bin=$(mktemp -d); trap 'kill $pid 2>/dev/null || true; rm -rf "$bin"' EXIT
go build -o "$bin" ./cmd/meshd ./cmd/meshctl
addr=127.0.0.1:$((20000 + RANDOM % 10000))
"$bin/meshd" --demo --listen "$addr" --log-level warn & pid=$!
for _ in $(seq 50); do curl -sf "http://$addr/readyz" >/dev/null && break; sleep 0.1; done
body='{"jsonrpc":"2.0","id":1,"method":"echo.echo","params":{"data":"hello"}}'
for i in 1 2 3; do
  h=$(hey -n 20000 -c 16 -m POST -T application/json -d "$body" "http://$addr/rpc" | awk '/Requests\/sec/ {print $2}')
  m=$("$bin/meshctl" bench echo.echo '{"data":"hello"}' -n 20000 -c 16 --hub "http://$addr/rpc" -o json | python3 -c 'import json,sys; print(json.load(sys.stdin)["rps"])')
  python3 -c "h=$h; m=$m; print(f'run $i: hey {h:.0f}/s, meshctl bench {m:.0f}/s, meshctl/hey {m/h:.3f}')"
done
