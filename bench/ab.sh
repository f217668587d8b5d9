#!/usr/bin/env bash
# A/B of agentmesh against another commit of itself, in one run: the
# harness is built at BASE (its hub, agent and client all from that
# commit) and at the work tree, and the two run alternately, ROUNDS times,
# with the same flags. It prints each system's median figures per build
# and their ratio (new / base).
#
#   bench/ab.sh BASE [ROUNDS] [harness flags, default: -d 3s -c 128 -only agentmesh]
#   bench/ab.sh 114a89e 5 -d 3s -c 1,128 -only agentmesh,agentmesh-jsonrpc
set -euo pipefail
cd "$(dirname "$0")"
base=${1:?usage: ab.sh BASE [ROUNDS] [flags]}
rounds=${2:-3}
shift $(( $# >= 2 ? 2 : 1 ))
flags=("$@")
[ ${#flags[@]} -gt 0 ] || flags=(-d 3s -c 128 -only agentmesh)

out=$(mktemp -d -t agentmesh-ab.XXXXXX)
wt="$out/base-src"
git worktree add -q --detach "$wt" "$base"
trap 'git worktree remove --force "$wt"' EXIT
(cd "$wt/bench" && go build -o "$out/bench-base" .)
go build -o "$out/bench-new" .

for r in $(seq "$rounds"); do
  for b in base new; do
    echo "round $r/$rounds: $b" >&2
    "$out/bench-$b" "${flags[@]}" -json "$out/$b-$r.json" >/dev/null
  done
done

python3 - "$out" "$rounds" <<'PY'
import json, statistics, sys
out, rounds = sys.argv[1], int(sys.argv[2])
runs = {b: [json.load(open(f"{out}/{b}-{r}.json")) for r in range(1, rounds + 1)] for b in ("base", "new")}
def med(b, system, i, key):
    vals = []
    for run in runs[b]:
        for res in run:
            if res["system"] == system:
                c = res["cells"][i]
                vals.append((c.get("proc_cpu_us") or {}).get("mesh-hub", 0) if key == "hub_cpu_us" else c[key])
    return statistics.median(vals) if vals else 0  # 0: the system or figure is not in that build
print(f"medians of {rounds} alternating rounds; ratio = new / base")
for res in runs["new"][0]:
    s = res["system"]
    for i, cell in enumerate(res["cells"]):
        row = []
        for key in ("rps", "p50_us", "p99_us", "cpu_ms_per_1k", "hub_cpu_us"):
            a, b = med("base", s, i, key), med("new", s, i, key)
            row.append(f"{key} {a:.1f} -> {b:.1f} ({b / a:.2f}x)" if a else f"{key} - -> {b:.1f}")
        print(f"{s} c={cell['concurrency']}: " + "; ".join(row))
PY
