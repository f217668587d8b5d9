#!/usr/bin/env bash
# soak-tests.sh N: runs the README's test command N times (default 5) on a
# fresh clone of this repository's HEAD, and prints each run's result and
# duration, then the tests that failed in any run (the flakes found).
#
# It never retries a failed run: every run counts. Each run's whole output
# is kept in the work directory it prints (SOAK_DIR to choose one).
set -uo pipefail

n=${1:-5}
repo=$(git -C "$(dirname "$0")/.." rev-parse --show-toplevel)
work=${SOAK_DIR:-$(mktemp -d -t agentmesh-soak.XXXXXX)}
mkdir -p "$work"

# The README's test command, read from the README itself so that the two
# cannot drift apart: the first line after "Run the whole test suite" that
# starts with "go test".
cmd=$(awk '/^Run the whole test suite/ {found=1} found && /^go test/ {print; exit}' "$repo/README.md")
if [ -z "$cmd" ]; then
  echo "soak: no test command found in $repo/README.md" >&2
  exit 2
fi

git clone -q "$repo" "$work/clone" || exit 2
if [ -d "$repo/../shared" ] && [ ! -e "$work/shared" ]; then
  ln -s "$(cd "$repo/../shared" && pwd)" "$work/shared" # the workspace's documents, as in CI
fi
echo "soak: $n runs of the README's test command on a fresh clone of $(git -C "$repo" rev-parse --short HEAD) in $work/clone"
echo "soak: $cmd"

passed=0
for i in $(seq 1 "$n"); do
  log="$work/run-$i.log"
  start=$(date +%s)
  (cd "$work/clone" && bash -c "$cmd") >"$log" 2>&1
  rc=$?
  secs=$(($(date +%s) - start))
  if [ "$rc" -eq 0 ]; then
    passed=$((passed + 1))
    echo "run $i: PASS in ${secs}s"
  else
    echo "run $i: FAIL (exit $rc) in ${secs}s: $(grep -E '^--- FAIL' "$log" | sed 's/^--- FAIL: //; s/ (.*//' | sort -u | tr '\n' ' ')"
  fi
done

echo "soak: $passed of $n runs passed"
flakes=$(grep -hE '^\s*--- FAIL' "$work"/run-*.log 2>/dev/null | sed 's/^\s*--- FAIL: //; s/ (.*//' | sort | uniq -c | sort -rn)
if [ -n "$flakes" ]; then
  echo "soak: tests that failed (count of runs, name):"
  echo "$flakes"
fi
[ "$passed" -eq "$n" ]
