#!/usr/bin/env python3
"""The conformance agent of sdk/PROTOCOL.md, with the Python SDK.

    /usr/bin/python3 sdk/python/examples/agent.py --hub ws://127.0.0.1:7700/ws [--hub ...] \
        [--name py] [--token T] [--drain-timeout 5s]

Also MESH_HUB (comma-separated URLs), MESH_AGENT_NAME and MESH_TOKEN. It
serves N.echo, N.sleep, N.aborted, N.fail and N.trace (N: the name), logs
one line to stderr when registered, and exits 0 after draining on SIGTERM
or SIGINT.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import agentmesh  # noqa: E402
from agentmesh import Agent, Context, MeshError  # noqa: E402

def duration(text: str) -> float:
    try:
        return agentmesh.parse_duration(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def build(name: str, hubs: list[str], token: str | None, drain: float) -> Agent:
    agent = Agent(name, hubs, token=token, drain_timeout=drain)
    aborted: dict[str, str] = {}

    @agent.method(f"{name}.echo")
    async def echo(params: Any, ctx: Context) -> Any:
        return params

    @agent.method(f"{name}.sleep")
    async def sleep(params: Any, ctx: Context) -> Any:
        p = params if isinstance(params, dict) else {}
        ms = p.get("ms", 0)
        if not isinstance(ms, (int, float)) or isinstance(ms, bool) or ms < 0:
            raise MeshError(agentmesh.INVALID_PARAMS, "ms must be a number of milliseconds")
        key = p.get("key")
        try:
            await asyncio.sleep(ms / 1000)
        except asyncio.CancelledError:
            if isinstance(key, str) and key:
                reason = ctx.reason
                aborted[key] = str(reason) if reason else "cancelled"
            raise
        return {"slept": ms}

    @agent.method(f"{name}.aborted")
    async def was_aborted(params: Any, ctx: Context) -> Any:
        key = params.get("key") if isinstance(params, dict) else None
        if not isinstance(key, str):
            raise MeshError(agentmesh.INVALID_PARAMS, "key must be a string")
        if key in aborted:
            return {"aborted": True, "reason": aborted[key]}
        return {"aborted": False, "reason": ""}

    @agent.method(f"{name}.fail")
    async def fail(params: Any, ctx: Context) -> Any:
        msg = params.get("message") if isinstance(params, dict) else None
        raise RuntimeError(msg if isinstance(msg, str) else "failed")

    @agent.method(f"{name}.trace")
    async def trace(params: Any, ctx: Context) -> Any:
        return {"traceparent": ctx.traceparent or "", "tracestate": ctx.tracestate or ""}

    return agent


def main() -> int:
    ap = argparse.ArgumentParser(description="The agentmesh conformance agent (Python SDK).")
    ap.add_argument("--hub", action="append", default=None,
                    help="hub URL (repeat it for several hubs; default $MESH_HUB or ws://127.0.0.1:7700/ws)")
    ap.add_argument("--name", default=os.environ.get("MESH_AGENT_NAME") or "py", help="agent name N (default py)")
    ap.add_argument("--token", default=os.environ.get("MESH_TOKEN") or None, help="bearer token")
    ap.add_argument("--drain-timeout", type=duration, default=5.0, help="drain timeout on shutdown, e.g. 5s, 500ms")
    ap.add_argument("--log-level", default="info", help="debug, info, warning or error")
    args = ap.parse_args()
    hubs = args.hub or [h for h in (os.environ.get("MESH_HUB") or "").split(",") if h.strip()] or [agentmesh.DEFAULT_HUB]

    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
    log = logging.getLogger("agentmesh")
    log.addHandler(handler)
    log.setLevel(args.log_level.upper())
    log.propagate = False

    agent = build(args.name, hubs, args.token, args.drain_timeout)
    try:
        asyncio.run(agent.run_until_signal())
    except MeshError as e:
        print(f"agent: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
