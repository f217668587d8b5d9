#!/usr/bin/env python3
"""A closed-loop load generator with the Python SDK's Client: C workers
each call METHOD, await the answer and call again, for a duration.

    /usr/bin/python3 sdk/python/examples/bench.py [--hub URL] [-c 16] [-d 10s] \
        [--timeout 5s] METHOD [PARAMS_JSON]

Prints one JSON line:
{"calls":N,"errors":E,"seconds":S,"callsPerSecond":R,"p50ms":..,"p99ms":..}
(latencies of the calls that succeeded; errors by code on stderr).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from collections import Counter
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import agentmesh  # noqa: E402
from agentmesh import Client, MeshError  # noqa: E402


def duration(text: str) -> float:
    try:
        return agentmesh.parse_duration(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def percentile(sorted_values: list[float], q: float) -> float:
    if not sorted_values:
        return 0.0
    i = min(len(sorted_values) - 1, max(0, int(round(q * len(sorted_values) + 0.5)) - 1))
    return sorted_values[i]


async def bench(args: argparse.Namespace, hubs: list[str], params: Any) -> dict[str, Any]:
    lat: list[float] = []
    errors: Counter[str] = Counter()
    async with Client(hubs, token=args.token, timeout=args.timeout) as c:
        try:  # dial (and warm up) before the clock starts
            await c.call(args.method, params)
        except MeshError as e:
            if e.code in ("UNAUTHENTICATED", "PERMISSION_DENIED") or (e.code == "UNAVAILABLE" and e.not_sent):
                raise
        start = time.perf_counter()
        end = start + args.duration

        async def worker() -> None:
            while True:
                t0 = time.perf_counter()
                if t0 >= end:
                    return
                try:
                    await c.call(args.method, params)
                except MeshError as e:
                    errors[e.code] += 1
                    continue
                lat.append(time.perf_counter() - t0)

        await asyncio.gather(*(worker() for _ in range(args.concurrency)))
        seconds = time.perf_counter() - start
    lat.sort()
    n = len(lat) + sum(errors.values())
    if errors:
        print("bench: errors " + ", ".join(f"{k}={v}" for k, v in errors.most_common()), file=sys.stderr)
    return {
        "calls": n,
        "errors": sum(errors.values()),
        "seconds": round(seconds, 3),
        "callsPerSecond": round(n / seconds, 1) if seconds > 0 else 0.0,
        "p50ms": round(percentile(lat, 0.50) * 1000, 3),
        "p99ms": round(percentile(lat, 0.99) * 1000, 3),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description="Load-test a method through an agentmesh hub (closed loop).")
    ap.add_argument("--hub", action="append", default=None,
                    help="hub URL (repeat for several; default $MESH_HUB or ws://127.0.0.1:7700/ws)")
    ap.add_argument("-c", "--concurrency", type=int, default=16, help="calls in flight (default 16)")
    ap.add_argument("-d", "--duration", type=duration, default=10.0, help="how long, e.g. 10s (default 10s)")
    ap.add_argument("--timeout", type=duration, default=5.0, help="timeout of each call (default 5s)")
    ap.add_argument("--token", default=os.environ.get("MESH_TOKEN") or None, help="bearer token")
    ap.add_argument("method")
    ap.add_argument("params", nargs="?", default=None, help="params as JSON (default null)")
    args = ap.parse_args()
    if args.concurrency < 1:
        ap.error("-c must be at least 1")
    hubs = args.hub or [h for h in (os.environ.get("MESH_HUB") or "").split(",") if h.strip()] or [agentmesh.DEFAULT_HUB]
    try:
        params = None if args.params is None else json.loads(args.params)
    except ValueError as e:
        print(f"bench: PARAMS_JSON is not JSON: {e}", file=sys.stderr)
        return 2
    try:
        out = asyncio.run(bench(args, hubs, params))
    except MeshError as e:
        print(f"bench: {e}", file=sys.stderr)
        return 1
    print(json.dumps(out, separators=(",", ":")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
