#!/usr/bin/env bash
# Builds a real Jaeger v2 (v2.13.0: Go module github.com/jaegertracing/jaeger
# at v1.76.0) from the Go module proxy, once, and prints the binary's path on
# stdout (nothing else goes to stdout). The end-to-end trace tests
# (e2e/jaeger_test.go) run it; they read its path from MESH_JAEGER_BIN:
#
#   export MESH_JAEGER_BIN=$(scripts/jaeger.sh)
#
# The binary is cached in ${XDG_CACHE_HOME:-$HOME/.cache}/agentmesh/
# jaeger-v1.76.0/jaeger (MESH_JAEGER_CACHE overrides the directory); when it
# is there the script does nothing else. It needs only Go: no git, no Docker,
# no Node (the UI is left out: the query API is all the tests use, and the
# binary serves a placeholder page at /).
#
# Jaeger's go.mod has replace directives, so `go install module@version`
# refuses it. The module is downloaded and built in its own module-cache
# copy: that directory is read-only, which is fine since its go.sum is
# complete and -mod=readonly never writes it (its dependencies go to the
# module cache as for any build).
#
# Cost, measured on this machine (2 shared cores, Go 1.26): 4 min 19 s with
# an empty build cache and none of Jaeger's dependencies in the module cache
# (302 modules downloaded: +1.2 GB of module cache, +1.6 GB of build cache;
# the binary is 116 MB); 3 min 40 s with those modules already downloaded
# but an empty build cache (the compile is the cost, on both cores); 6 s
# (the link) with a warm build cache; nothing once the binary is cached.
#
# Safe to run concurrently: a run builds into a temporary file next to the
# binary and renames it into place, and where flock(1) exists a second run
# waits for the first and then finds the binary.
set -euo pipefail

version=v1.76.0        # the Go module's version
jaeger_version=v2.13.0 # the Jaeger v2 release it is (what `jaeger version` says)
module=github.com/jaegertracing/jaeger

cache="${MESH_JAEGER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/agentmesh/jaeger-$version}"
bin="$cache/jaeger"
if [ -x "$bin" ]; then
  echo "$bin"
  exit 0
fi
mkdir -p "$cache"
cache=$(cd "$cache" && pwd) # absolute: go build -C changes directory first
bin="$cache/jaeger"

if command -v flock >/dev/null 2>&1; then
  exec 9>"$cache/.lock"
  flock 9
  if [ -x "$bin" ]; then # built by the run we waited for
    echo "$bin"
    exit 0
  fi
fi

# An empty directory to run `go mod download` in, and one next to the
# binary to build into (go build will not overwrite a file that is not an
# executable, and the rename must stay on one file system).
tmp=$(mktemp -d "${TMPDIR:-/tmp}/agentmesh-jaeger.XXXXXX")
outdir=$(mktemp -d "$cache/build.XXXXXX")
out="$outdir/jaeger"
trap 'rm -rf "$tmp" "$outdir"' EXIT

# No workspace or GOFLAGS of the caller's: the build is Jaeger's own.
export GOWORK=off
unset GOFLAGS

start=$(date +%s)
echo "jaeger.sh: building Jaeger $jaeger_version ($module@$version) into $bin" >&2
# Run from an empty directory, so that no go.mod around is touched.
json=$(cd "$tmp" && GOFLAGS=-mod=mod go mod download -json "$module@$version")
dir=$(printf '%s\n' "$json" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",\{0,1\}$/\1/p')
if [ -z "$dir" ] || [ ! -f "$dir/go.mod" ]; then
  echo "jaeger.sh: go mod download $module@$version gave no module directory:" >&2
  printf '%s\n' "$json" >&2
  exit 1
fi

# As Jaeger's Makefile builds it (CGO off, -trimpath, the version in
# internal/version), without the git-derived commit and date.
CGO_ENABLED=0 GOFLAGS=-mod=readonly go build -C "$dir" -trimpath \
  -ldflags "-X $module/internal/version.latestVersion=$jaeger_version" \
  -o "$out" ./cmd/jaeger
chmod 755 "$out"
"$out" version >/dev/null # it runs
mv -f "$out" "$bin"
echo "jaeger.sh: built in $(($(date +%s) - start)) s" >&2
echo "$bin"
