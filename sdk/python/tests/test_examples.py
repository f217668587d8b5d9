"""The example programs as processes, against the fake hub."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from fakehub import Conn, FakeHub, LeakCheck, until  # noqa: E402

from agentmesh import MeshError  # noqa: E402

EXAMPLES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples")
# The examples find the package themselves (no PYTHONPATH), from any directory.
ENV = {k: v for k, v in os.environ.items() if not k.startswith("MESH_") and k != "PYTHONPATH"}


class ExampleTest(LeakCheck):
    async def asyncSetUp(self) -> None:
        await super().asyncSetUp()
        self.hub = await FakeHub(heartbeat=0.2).start()
        self.addAsyncCleanup(self.hub.stop)

    async def spawn(self, script: str, *args: str, env: dict[str, str] | None = None) -> asyncio.subprocess.Process:
        p = await asyncio.create_subprocess_exec(
            sys.executable, os.path.join(EXAMPLES, script), *args, cwd="/",
            env=env or ENV, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )

        async def reap() -> None:
            if p.returncode is None:
                p.kill()
            await p.communicate()

        self.addAsyncCleanup(reap)
        return p


class TestConformanceAgent(ExampleTest):
    async def test_agent(self) -> None:
        p = await self.spawn("agent.py", "--hub", self.hub.url, "--name", "pyx", "--drain-timeout", "2s")
        assert p.stderr is not None
        line = (await asyncio.wait_for(p.stderr.readline(), 10)).decode()
        self.assertIn("registered", line)
        conn = await self.hub.wait_conn(1)
        reg = conn.requests("agent.register")[0]["params"]
        self.assertEqual(reg["name"], "pyx")
        self.assertEqual(reg["capabilities"], ["pyx.aborted", "pyx.echo", "pyx.fail", "pyx.sleep", "pyx.trace"])

        for v in [{"a": 1, "b": [True, None]}, "héllo ✓ 😀", 1e21, -17, None, "nul \u0000 ls \u2028"]:
            self.assertEqual((await conn.call("pyx.echo", v))["result"], v)
        res = await conn.call("pyx.fail", {"message": "boom-1"})
        self.assertEqual((res["error"]["code"], res["error"]["message"]), ("INTERNAL_ERROR", "boom-1"))
        res = await conn.call("pyx.trace", {}, headers={"traceparent": "00-" + "1" * 32 + "-" + "2" * 16 + "-01", "tracestate": "c=1"})
        self.assertEqual(res["result"], {"traceparent": "00-" + "1" * 32 + "-" + "2" * 16 + "-01", "tracestate": "c=1"})

        # ttl: the sleep's signal fires, N.aborted says so with the reason
        res = await conn.call("pyx.sleep", {"ms": 5000, "key": "t"}, headers={"ttl": 100})
        self.assertEqual(res["error"]["code"], "TIMEOUT")
        ab = (await conn.call("pyx.aborted", {"key": "t"}))["result"]
        self.assertTrue(ab["aborted"])
        self.assertIn("TIMEOUT", ab["reason"])
        # cancel frame
        seq, fut, f = conn.request("pyx.sleep", {"ms": 5000, "key": "c"})
        await conn.send(f)
        await asyncio.sleep(0.1)
        await conn.send({"type": "cancel", "seq": seq})
        self.assertEqual((await asyncio.wait_for(fut, 2))["error"]["code"], "CANCELLED")
        ab = (await conn.call("pyx.aborted", {"key": "c"}))["result"]
        self.assertEqual((ab["aborted"], "CANCELLED" in ab["reason"]), (True, True))
        self.assertEqual((await conn.call("pyx.aborted", {"key": "never"}))["result"], {"aborted": False, "reason": ""})
        self.assertEqual((await conn.call("pyx.sleep", {"ms": 10, "key": "s"}))["result"], {"slept": 10})
        await until(lambda: len(conn.requests("agent.heartbeat")) >= 2, 2, "heartbeats")

        # SIGTERM during a call: deregistered first, the call answered, exit 0
        seq, fut, f = conn.request("pyx.sleep", {"ms": 400, "key": "term"})
        await conn.send(f)
        await asyncio.sleep(0.1)
        start = time.monotonic()
        p.send_signal(signal.SIGTERM)
        await until(lambda: conn.requests("agent.deregister"), 1, "deregistered")
        self.assertLess(time.monotonic() - start, 0.2)
        self.assertEqual((await asyncio.wait_for(fut, 2))["result"], {"slept": 400})
        self.assertEqual(await asyncio.wait_for(p.wait(), 3), 0)
        await asyncio.wait_for(conn.closed.wait(), 1)
        self.assertEqual(conn.close_code, 1000)

    async def test_env_and_sigint(self) -> None:
        env = dict(ENV, MESH_HUB="ws://127.0.0.1:1/ws," + self.hub.url, MESH_AGENT_NAME="envy", MESH_TOKEN="tk")
        p = await self.spawn("agent.py", env=env)
        conn = await self.hub.wait_conn(1, 8)
        self.assertEqual(conn.requests("agent.register")[0]["params"]["name"], "envy")
        self.assertEqual(conn.authorization, "Bearer tk")
        p.send_signal(signal.SIGINT)
        self.assertEqual(await asyncio.wait_for(p.wait(), 3), 0)


class TestClientExample(ExampleTest):
    async def asyncSetUp(self) -> None:
        await super().asyncSetUp()

        async def echo(conn: Conn, f: dict[str, Any]) -> Any:
            return {"params": f.get("params"), "traceparent": (f.get("headers") or {}).get("traceparent"),
                    "ttl": (f.get("headers") or {}).get("ttl")}

        async def fail(conn: Conn, f: dict[str, Any]) -> Any:
            raise MeshError("INVALID_PARAMS", "no such key")

        self.hub.methods["x.echo"] = echo
        self.hub.methods["x.fail"] = fail

    async def test_result(self) -> None:
        p = await self.spawn("client.py", "--hub", self.hub.url, "--timeout", "2s", "--traceparent", "00-aa-bb-01",
                             "x.echo", '{"k":"é"}')
        out, err = await asyncio.wait_for(p.communicate(), 10)
        self.assertEqual(p.returncode, 0, err)
        lines = out.decode().splitlines()
        self.assertEqual(len(lines), 1)
        got = json.loads(lines[0])
        self.assertEqual(got["params"], {"k": "é"})
        self.assertEqual(got["traceparent"], "00-aa-bb-01")
        self.assertTrue(1500 < got["ttl"] <= 2000)

    async def test_error(self) -> None:
        p = await self.spawn("client.py", "--hub", self.hub.url, "x.fail")
        out, _ = await asyncio.wait_for(p.communicate(), 10)
        self.assertEqual(p.returncode, 1)
        self.assertEqual(json.loads(out), {"error": {"code": "INVALID_PARAMS", "message": "no such key"}})

    async def test_bench(self) -> None:
        p = await self.spawn("bench.py", "--hub", self.hub.url, "-c", "4", "-d", "300ms", "x.echo", "{}")
        out, err = await asyncio.wait_for(p.communicate(), 10)
        self.assertEqual(p.returncode, 0, err)
        r = json.loads(out)
        self.assertEqual(set(r), {"calls", "errors", "seconds", "callsPerSecond", "p50ms", "p99ms"})
        self.assertGreater(r["calls"], 10)
        self.assertEqual(r["errors"], 0)
        self.assertLessEqual(r["p50ms"], r["p99ms"])


if __name__ == "__main__":
    import unittest

    unittest.main()
