"""The Client against a fake hub over real loopback WebSockets."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from fakehub import NO_ANSWER, Conn, FakeHub, HungServer, LeakCheck, until  # noqa: E402

from agentmesh import Client, MeshError  # noqa: E402


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class ClientTest(LeakCheck):
    async def asyncSetUp(self) -> None:
        await super().asyncSetUp()
        self.hub = await FakeHub().start()
        self.addAsyncCleanup(self.hub.stop)
        self.hub.methods["echo"] = self._echo
        self.hub.methods["hang"] = self._hang
        self.hub.methods["fail"] = self._fail
        self.hub.methods["which"] = self._which
        self.hub.methods["hold"] = self._hold
        self.released = asyncio.Event()

    async def _echo(self, conn: Conn, f: dict[str, Any]) -> Any:
        return {"params": f.get("params"), "headers": f.get("headers"), "id": f.get("id")}

    async def _hang(self, conn: Conn, f: dict[str, Any]) -> Any:
        return NO_ANSWER

    async def _fail(self, conn: Conn, f: dict[str, Any]) -> Any:
        raise MeshError("OVERLOADED", "too busy", details={"retryAfterMs": 50}, not_sent=True)

    async def _which(self, conn: Conn, f: dict[str, Any]) -> Any:
        return conn.hub.port

    async def _hold(self, conn: Conn, f: dict[str, Any]) -> Any:
        await self.released.wait()
        return "released"


class TestCalls(ClientTest):
    async def test_call(self) -> None:
        async with Client(self.hub.url, timeout=5) as c:
            r = await c.call("echo", {"a": [1, "é"]})
            self.assertEqual(r["params"], {"a": [1, "é"]})
            self.assertTrue(4900 <= r["headers"]["ttl"] <= 5000, r["headers"])
            self.assertTrue(r["id"])
            r = await c.call("echo", None, timeout=1.5, traceparent="00-abc-def-01", tracestate="x=1",
                             headers={"baggage": "k=v", "correlationId": "c-1"})
            h = r["headers"]
            self.assertTrue(1400 <= h["ttl"] <= 1500)
            self.assertEqual((h["traceparent"], h["tracestate"], h["baggage"], h["correlationId"]),
                             ("00-abc-def-01", "x=1", "k=v", "c-1"))
            self.assertEqual(c.hub, self.hub.url)
        self.assertEqual(len(self.hub.conns), 1, "one link for every call")
        reqs = self.hub.last.requests("echo")
        self.assertEqual([f["seq"] for f in reqs], [1, 2])
        self.assertEqual(reqs[0]["version"], "1.0")
        self.assertNoSDKTasks()

    async def test_lazy_dial(self) -> None:
        c = Client(self.hub.url)
        await asyncio.sleep(0.05)
        self.assertEqual(self.hub.conns, [])
        await c.call("echo", 1)
        self.assertEqual(len(self.hub.conns), 1)
        await c.close()
        with self.assertRaises(MeshError) as cm:
            await c.call("echo", 1)
        self.assertEqual(cm.exception.code, "UNAVAILABLE")

    async def test_error_answer(self) -> None:
        async with Client(self.hub.url) as c:
            with self.assertRaises(MeshError) as cm:
                await c.call("fail", {})
            e = cm.exception
            self.assertEqual((e.code, e.rpc_code, e.message, e.retryable, e.not_sent, e.details),
                             ("OVERLOADED", -32005, "too busy", True, True, {"retryAfterMs": 50}))
            with self.assertRaises(MeshError) as cm:
                await c.call("missing", {})
            self.assertEqual(cm.exception.code, "METHOD_NOT_FOUND")

    async def test_timeout_sends_cancel(self) -> None:
        async with Client(self.hub.url) as c:
            start = time.monotonic()
            with self.assertRaises(MeshError) as cm:
                await c.call("hang", {}, timeout=0.2)
            took = time.monotonic() - start
            self.assertEqual(cm.exception.code, "TIMEOUT")
            self.assertGreaterEqual(took, 0.19)
            self.assertLess(took, 0.5)
            conn = self.hub.last
            seq = conn.requests("hang")[0]["seq"]
            self.assertTrue(150 <= conn.requests("hang")[0]["headers"]["ttl"] <= 200)  # the dial came off it
            await until(lambda: conn.of_type("cancel"), 1, "a cancel frame")
            self.assertEqual(conn.of_type("cancel"), [{"type": "cancel", "seq": seq}])
            # the link is still good
            self.assertEqual((await c.call("echo", 2))["params"], 2)

    async def test_task_cancel_sends_cancel(self) -> None:
        async with Client(self.hub.url) as c:
            t = asyncio.create_task(c.call("hang", {}))
            await until(lambda: self.hub.conns and self.hub.last.requests("hang"), 1, "the call sent")
            t.cancel()
            with self.assertRaises(asyncio.CancelledError):
                await t
            conn = self.hub.last
            await until(lambda: conn.of_type("cancel"), 1, "a cancel frame")
            self.assertEqual(conn.of_type("cancel")[0]["seq"], conn.requests("hang")[0]["seq"])
            # wait_for's timeout is a cancellation too
            with self.assertRaises(TimeoutError):
                await asyncio.wait_for(c.call("hang", {}), 0.1)
            await until(lambda: len(conn.of_type("cancel")) == 2, 1, "a second cancel frame")

    async def test_late_answer_ignored(self) -> None:
        async with Client(self.hub.url) as c:
            with self.assertRaises(MeshError):
                await c.call("hold", {}, timeout=0.1)
            self.released.set()  # its answer comes after the cancel
            await until(lambda: any(f.get("type") == "cancel" for f in self.hub.last.frames), 1, "cancel")
            await asyncio.sleep(0.05)
            self.assertEqual((await c.call("echo", 3))["params"], 3)

    async def test_concurrent_calls_matched_by_seq(self) -> None:
        async with Client(self.hub.url) as c:
            results = await asyncio.gather(*(c.call("echo", i) for i in range(200)))
            self.assertEqual([r["params"] for r in results], list(range(200)))
            # the requests written together went out in batches
            self.assertTrue(any(n > 1 for n in self.hub.last.message_sizes), self.hub.last.message_sizes)

    async def test_batch_answers(self) -> None:
        async def batch(conn: Conn, f: dict[str, Any]) -> Any:
            return NO_ANSWER

        self.hub.methods["later"] = batch
        async with Client(self.hub.url) as c:
            calls = [asyncio.create_task(c.call("later", i)) for i in range(3)]
            conn = await self._conn_with(3, "later")
            reqs = conn.requests("later")
            # one message: the answers in reverse order, and an unknown seq
            await conn.send([{"type": "res", "seq": f["seq"], "result": f["params"] * 10} for f in reversed(reqs)]
                            + [{"type": "res", "seq": 999, "result": 0}])
            self.assertEqual(await asyncio.gather(*calls), [0, 10, 20])

    async def _conn_with(self, n: int, method: str) -> Conn:
        await until(lambda: self.hub.conns and len(self.hub.last.requests(method)) >= n, 1, f"{n} {method} calls")
        return self.hub.last

    async def test_link_lost_unavailable_then_redial(self) -> None:
        hub2 = await FakeHub().start()
        self.addAsyncCleanup(hub2.stop)
        hub2.methods["which"] = self._which
        async with Client([self.hub.url, hub2.url]) as c:
            self.assertEqual(await c.call("which"), self.hub.port)
            t = asyncio.create_task(c.call("hang", {}))
            await self._conn_with(1, "hang")
            self.hub.last.drop()
            with self.assertRaises(MeshError) as cm:
                await asyncio.wait_for(t, 1)
            self.assertEqual(cm.exception.code, "UNAVAILABLE")
            # the next call dials again, the next URL first
            self.assertEqual(await c.call("which"), hub2.port)
            self.assertEqual(c.hub, hub2.url)

    async def test_hung_hub_detected_by_ping(self) -> None:
        async with Client(self.hub.url, ping_interval=0.1) as c:
            await c.call("echo", 1)
            await asyncio.sleep(0.4)
            self.assertEqual((await c.call("echo", 2))["params"], 2, "a hub that answers its pings stays")
            t = asyncio.create_task(c.call("hang", {}))
            await self._conn_with(1, "hang")
            frozen = time.monotonic()
            self.hub.last.freeze()
            with self.assertRaises(MeshError) as cm:
                await asyncio.wait_for(t, 1)
            self.assertEqual(cm.exception.code, "UNAVAILABLE")
            self.assertIn("no pong", cm.exception.message)
            self.assertLess(time.monotonic() - frozen, 0.45)
            self.assertEqual((await c.call("echo", 3))["params"], 3)
            self.assertEqual(len(self.hub.conns), 2)

    async def test_close_fails_pending(self) -> None:
        c = Client(self.hub.url)
        t = asyncio.create_task(c.call("hang", {}))
        await self._conn_with(1, "hang")
        await c.close()
        with self.assertRaises(MeshError) as cm:
            await t
        self.assertEqual(cm.exception.code, "UNAVAILABLE")
        await asyncio.wait_for(self.hub.last.closed.wait(), 1)
        self.assertEqual(self.hub.last.close_code, 1000)
        self.assertNoSDKTasks()

    async def test_unreachable(self) -> None:
        async with Client(f"ws://127.0.0.1:{free_port()}/ws") as c:
            with self.assertRaises(MeshError) as cm:
                await c.call("echo", 1)
            self.assertEqual(cm.exception.code, "UNAVAILABLE")
            self.assertTrue(cm.exception.not_sent)
            self.assertTrue(cm.exception.retryable)

    async def test_hung_upgrade(self) -> None:
        # a server that takes the TCP connection and never answers the upgrade
        async with HungServer() as srv, Client(srv.url) as c:
            start = time.monotonic()
            with self.assertRaises(MeshError) as cm:
                await c.call("echo", 1, timeout=0.3)
            took = time.monotonic() - start
            self.assertEqual((cm.exception.code, cm.exception.not_sent), ("UNAVAILABLE", True))
            self.assertGreaterEqual(took, 0.29)
            self.assertLess(took, 0.6)
            # the caller's own cancellation during the dial ends it at once too
            t = asyncio.create_task(c.call("echo", 1, timeout=5))
            await asyncio.sleep(0.1)
            start = time.monotonic()
            t.cancel()
            with self.assertRaises(asyncio.CancelledError):
                await t
            self.assertLess(time.monotonic() - start, 0.2)
        self.assertNoSDKTasks()

    async def test_first_hub_down_tries_next(self) -> None:
        async with Client([f"ws://127.0.0.1:{free_port()}/ws", self.hub.url]) as c:
            self.assertEqual(await c.call("which"), self.hub.port)

    async def test_token(self) -> None:
        async with Client(self.hub.url, token="tok-1") as c:
            await c.call("echo", 1)
        self.assertEqual(self.hub.last.authorization, "Bearer tok-1")
        self.hub.refuse_status = 403
        async with Client(self.hub.url, token="tok-2") as c:
            with self.assertRaises(MeshError) as cm:
                await c.call("echo", 1)
            self.assertEqual(cm.exception.code, "PERMISSION_DENIED")
        self.assertEqual(self.hub.authorizations[-1], "Bearer tok-2")

    async def test_goaway_next_call_new_link(self) -> None:
        async with Client(self.hub.url) as c:
            t = asyncio.create_task(c.call("hold", {}))
            conn = await self._conn_with(1, "hold")
            await conn.goaway()
            await asyncio.sleep(0.05)
            self.assertEqual((await c.call("echo", 1))["params"], 1)
            self.assertEqual(len(self.hub.conns), 2, "a new link after goaway")
            self.assertFalse(conn.closed.is_set(), "the old link stays for its call in flight")
            self.released.set()
            self.assertEqual(await t, "released")
            await asyncio.wait_for(conn.closed.wait(), 1)

    async def test_serves_nothing(self) -> None:
        async with Client(self.hub.url) as c:
            await c.call("echo", 1)
            conn = self.hub.last
            res = await conn.call("anything", {})
            self.assertEqual(res["error"]["code"], "METHOD_NOT_FOUND")

    async def test_params_not_json(self) -> None:
        async with Client(self.hub.url) as c:
            with self.assertRaises(MeshError) as cm:
                await c.call("echo", {"x": object()})
            self.assertEqual(cm.exception.code, "INVALID_REQUEST")
            self.assertEqual((await c.call("echo", 1))["params"], 1)


if __name__ == "__main__":
    import unittest

    unittest.main()
