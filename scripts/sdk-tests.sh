#!/usr/bin/env bash
# The TypeScript and Python SDKs' own unit tests (node --test, unittest),
# each against a fake hub in the test over loopback sockets; the Go suite
# (e2e TestConformance, TestSDKCrossLanguage) runs their example agents
# and clients against a real meshd.
#
# The TypeScript SDK needs its one npm package (ws): installed here when
# missing. The Python SDK needs the websockets package of Debian's
# /usr/bin/python3 (apt-get install python3-websockets; or MESH_PYTHON, a
# Python 3.11+ with websockets): without it the Python tests fail in CI (CI
# set, as .ci/run installs it) and are skipped, with that message, elsewhere.
set -euo pipefail
cd "$(dirname "$0")/.."

echo "== sdk/typescript: node --test"
if [ ! -f sdk/typescript/node_modules/ws/package.json ]; then
  npm ci --prefix sdk/typescript --no-audit --no-fund
fi
npm test --prefix sdk/typescript

echo "== sdk/python: unittest"
py="${MESH_PYTHON:-/usr/bin/python3}"
if ! "$py" -c 'import websockets' 2>/dev/null; then
  msg="$py cannot import websockets: apt-get install python3-websockets (or set MESH_PYTHON)"
  if [ -n "${CI:-}" ]; then echo "FAIL: $msg" >&2; exit 1; fi
  echo "SKIP the Python SDK's tests: $msg"
  exit 0
fi
(cd sdk/python && "$py" -X dev -W error::ResourceWarning -m unittest discover -s tests)
