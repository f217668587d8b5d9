#!/usr/bin/env python3
"""Calls one method through a hub with the Python SDK's Client.

    /usr/bin/python3 sdk/python/examples/client.py [--hub URL] [--timeout 5s] \
        [--traceparent TP] [--token T] METHOD [PARAMS_JSON]

Prints the result as one JSON line on stdout and exits 0; on an error
prints {"error":{"code":...,"message":...}} on stdout and exits 1.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import agentmesh  # noqa: E402
from agentmesh import Client, MeshError  # noqa: E402


def duration(text: str) -> float:
    try:
        return agentmesh.parse_duration(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


async def call(args: argparse.Namespace, hubs: list[str], params: Any) -> Any:
    async with Client(hubs, token=args.token, timeout=args.timeout) as c:
        return await c.call(args.method, params, traceparent=args.traceparent, tracestate=args.tracestate)


def main() -> int:
    ap = argparse.ArgumentParser(description="Call a method through an agentmesh hub.")
    ap.add_argument("--hub", action="append", default=None,
                    help="hub URL (repeat for several; default $MESH_HUB or ws://127.0.0.1:7700/ws)")
    ap.add_argument("--timeout", type=duration, default=10.0, help="call timeout, e.g. 5s, 500ms (default 10s)")
    ap.add_argument("--traceparent", default=None, help="W3C traceparent to send with the call")
    ap.add_argument("--tracestate", default=None, help="W3C tracestate to send with the call")
    ap.add_argument("--token", default=os.environ.get("MESH_TOKEN") or None, help="bearer token")
    ap.add_argument("method")
    ap.add_argument("params", nargs="?", default=None, help="params as JSON (default null)")
    args = ap.parse_args()
    hubs = args.hub or [h for h in (os.environ.get("MESH_HUB") or "").split(",") if h.strip()] or [agentmesh.DEFAULT_HUB]
    try:
        params = None if args.params is None else json.loads(args.params)
    except ValueError as e:
        print(f"client: PARAMS_JSON is not JSON: {e}", file=sys.stderr)
        return 2
    try:
        result = asyncio.run(call(args, hubs, params))
    except MeshError as e:
        err: dict[str, Any] = {"code": e.code, "message": e.message}
        if e.details is not None:
            err["details"] = e.details
        print(json.dumps({"error": err}, separators=(",", ":"), ensure_ascii=False))
        return 1
    print(json.dumps(result, separators=(",", ":"), ensure_ascii=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
