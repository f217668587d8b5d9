"""The Agent against a fake hub over real loopback WebSockets."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from fakehub import FakeHub, HungServer, LeakCheck, until  # noqa: E402

from agentmesh import Agent, Context, MeshError  # noqa: E402


class AgentTest(LeakCheck):
    async def asyncSetUp(self) -> None:
        await super().asyncSetUp()
        self.hub = await FakeHub(heartbeat=0.1).start()
        self.addAsyncCleanup(self.hub.stop)
        self.contexts: dict[str, Context] = {}
        self.events: dict[str, asyncio.Event] = {}

    def make_agent(self, hubs: Any = None, **kw: Any) -> Agent:
        a = Agent("t", hubs or self.hub.url, agent_id="agent-1", **kw)

        @a.method("t.echo")
        async def echo(params: Any, ctx: Context) -> Any:
            return params

        @a.method("t.sleep")
        async def sleep(params: Any, ctx: Context) -> Any:
            key = params["key"]
            self.contexts[key] = ctx
            self.events.setdefault(key, asyncio.Event()).set()
            try:
                await asyncio.sleep(params["ms"] / 1000)
            except asyncio.CancelledError:
                self.contexts[key + ".cancelled"] = ctx
                raise
            return {"slept": params["ms"]}

        @a.method("t.fail")
        async def fail(params: Any, ctx: Context) -> Any:
            raise RuntimeError(params["message"])

        @a.method("t.coded")
        async def coded(params: Any, ctx: Context) -> Any:
            raise MeshError("INVALID_PARAMS", "bad key", details={"key": params})

        @a.method("t.sync")
        def sync(params: Any) -> Any:
            return {"sync": params}

        @a.method("t.ctx")
        async def show(params: Any, ctx: Context) -> Any:
            return {"traceparent": ctx.traceparent, "tracestate": ctx.tracestate, "method": ctx.method,
                    "requestId": ctx.request_id, "baggage": ctx.headers.get("baggage"),
                    "remaining": ctx.remaining(), "origin": ctx.origin}

        @a.method("t.bad")
        async def bad(params: Any, ctx: Context) -> Any:
            return {"not json": object()}

        @a.method("pat.*")
        async def pattern(params: Any, ctx: Context) -> Any:
            return {"pattern": ctx.method}

        return a

    async def run_agent(self, agent: Agent) -> asyncio.Task[None]:
        task = asyncio.create_task(agent.run())

        async def stop() -> None:
            agent.stop()
            try:
                await asyncio.wait_for(task, 10)
            except MeshError:
                pass

        self.addAsyncCleanup(stop)
        await asyncio.wait_for(agent.registered(), 3)
        return task

    async def stop_agent(self, agent: Agent, task: asyncio.Task[None]) -> None:
        agent.stop()
        await asyncio.wait_for(task, 10)
        self.assertNoSDKTasks()


class TestRegistration(AgentTest):
    async def test_register_params(self) -> None:
        agent = self.make_agent(metadata={"team": "a"})
        task = await self.run_agent(agent)
        reg = self.hub.last.requests("agent.register")
        self.assertEqual(len(reg), 1)
        p = reg[0]["params"]
        self.assertEqual(p["agentId"], "agent-1")
        self.assertEqual(p["name"], "t")
        self.assertEqual(p["capabilities"], sorted(["t.echo", "t.sleep", "t.fail", "t.coded", "t.sync", "t.ctx", "t.bad", "pat.*"]))
        self.assertEqual(p["intents"], ["serve"])
        md = p["metadata"]
        self.assertEqual((md["sdk"], md["pid"], md["team"]), ("python", os.getpid(), "a"))
        self.assertTrue(md["hostname"] and md["version"])
        self.assertIsInstance(reg[0]["seq"], int)
        self.assertTrue(agent.is_registered)
        self.assertEqual(agent.hub, self.hub.url)
        await self.stop_agent(agent, task)
        self.assertFalse(agent.is_registered)

    async def test_hub_assigns_id(self) -> None:
        agent = self.make_agent()
        agent._id = ""  # none proposed: the hub's answer names the agent
        self.hub.methods["agent.register"] = self._assigning
        task = await self.run_agent(agent)
        self.assertEqual(agent.agent_id, "hub-chose-this")
        await until(lambda: self.hub.last.requests("agent.heartbeat"), 1, "a heartbeat")
        self.assertEqual(self.hub.last.requests("agent.heartbeat")[0]["params"]["agentId"], "hub-chose-this")
        await self.stop_agent(agent, task)

    async def _assigning(self, conn: Any, f: dict[str, Any]) -> Any:
        return {"agentId": "hub-chose-this", "accepted": True, "heartbeatInterval": 0.1, "assignedCapabilities": []}

    async def test_heartbeat_cadence(self) -> None:
        agent = self.make_agent()
        task = await self.run_agent(agent)
        await asyncio.sleep(0.55)
        beats = self.hub.last.requests("agent.heartbeat")
        # every 0.1 s: about 5 in 0.55 s
        self.assertGreaterEqual(len(beats), 4, beats)
        self.assertLessEqual(len(beats), 7, beats)
        st = beats[0]["params"]["status"]
        self.assertEqual(beats[0]["params"]["agentId"], "agent-1")
        self.assertEqual((st["state"], st["queuedRequests"]), ("ready", 0))
        self.assertIsInstance(st["lastActivity"], int)
        self.assertLessEqual(beats[0]["headers"]["ttl"], 100)
        times = [t for f, t in zip(self.hub.last.frames, self.hub.last.times) if f.get("method") == "agent.heartbeat"]
        gaps = [b - a for a, b in zip(times, times[1:])]
        self.assertTrue(all(0.07 < g < 0.2 for g in gaps), gaps)
        await self.stop_agent(agent, task)

    async def test_link_liveness_no_heartbeats(self) -> None:
        self.hub.liveness = "link"
        agent = self.make_agent()
        task = await self.run_agent(agent)
        await asyncio.sleep(0.35)
        self.assertEqual(self.hub.last.requests("agent.heartbeat"), [])
        self.assertTrue(agent.link_liveness)
        await self.stop_agent(agent, task)

    async def test_reregister_on_agent_not_found(self) -> None:
        agent = self.make_agent()
        task = await self.run_agent(agent)
        self.hub.heartbeat_error, self.hub.heartbeat_errors = "AGENT_NOT_FOUND", 1
        await until(lambda: len(self.hub.last.requests("agent.register")) == 2, 1, "a second agent.register")
        conn = self.hub.last
        self.assertEqual(len(self.hub.conns), 1, "registered again on the same link")
        self.assertEqual(conn.requests("agent.register")[1]["params"]["agentId"], "agent-1")
        # and heartbeats go on after it
        n = len(conn.requests("agent.heartbeat"))
        await until(lambda: len(conn.requests("agent.heartbeat")) > n + 1, 1, "heartbeats after re-registering")
        await self.stop_agent(agent, task)

    async def test_other_heartbeat_errors_are_tolerated(self) -> None:
        agent = self.make_agent()
        task = await self.run_agent(agent)
        self.hub.heartbeat_error, self.hub.heartbeat_errors = "UNAVAILABLE", 2
        await until(lambda: self.hub.heartbeat_errors == 0, 1, "two failed heartbeats")
        n = len(self.hub.last.requests("agent.heartbeat"))
        await until(lambda: len(self.hub.last.requests("agent.heartbeat")) > n, 1, "heartbeats go on")
        self.assertEqual(len(self.hub.last.requests("agent.register")), 1)
        self.assertEqual(len(self.hub.conns), 1)
        await self.stop_agent(agent, task)

    async def test_reconnect_after_drop(self) -> None:
        agent = self.make_agent()
        task = await self.run_agent(agent)
        first = self.hub.last
        seq, fut, f = first.request("t.sleep", {"ms": 5000, "key": "lost"})
        await first.send(f)
        await asyncio.wait_for(self.events.setdefault("lost", asyncio.Event()).wait(), 1)
        lost_at = time.monotonic()
        first.drop()
        # the handler's signal fires with UNAVAILABLE
        await until(lambda: "lost.cancelled" in self.contexts, 1, "the handler cancelled")
        ctx = self.contexts["lost.cancelled"]
        self.assertTrue(ctx.cancelled.is_set())
        self.assertEqual(ctx.reason.code if ctx.reason else None, "UNAVAILABLE")
        # and the agent comes back, same id, after the jittered delay (<= 1 s)
        second = await self.hub.wait_conn(2, 3)
        took = time.monotonic() - lost_at
        self.assertLess(took, 1.5)
        self.assertEqual(second.requests("agent.register")[0]["params"]["agentId"], "agent-1")
        await asyncio.wait_for(agent.registered(), 1)
        res = await second.call("t.echo", {"back": True})
        self.assertEqual(res["result"], {"back": True})
        await self.stop_agent(agent, task)

    async def test_hung_hub_detected_by_ping(self) -> None:
        hub2 = await FakeHub(heartbeat=0.1).start()
        self.addAsyncCleanup(hub2.stop)
        self.hub.heartbeat = 0.3  # heartbeats that time out do not end a link: the pings tell
        agent = self.make_agent(hubs=[self.hub.url, hub2.url], ping_interval=0.1)
        task = await self.run_agent(agent)
        first = self.hub.last
        await asyncio.sleep(0.5)  # a hub that answers its pings stays
        self.assertTrue(agent.is_registered)
        self.assertEqual(len(hub2.conns), 0)
        seq, fut, f = first.request("t.sleep", {"ms": 5000, "key": "hung"})
        await first.send(f)
        await asyncio.wait_for(self.events.setdefault("hung", asyncio.Event()).wait(), 1)
        frozen = time.monotonic()
        first.freeze()
        await until(lambda: "hung.cancelled" in self.contexts, 1, "the handler cancelled")
        took = time.monotonic() - frozen
        self.assertGreaterEqual(took, 0.1)
        self.assertLess(took, 0.45)  # two intervals without a pong, and a bit
        ctx = self.contexts["hung.cancelled"]
        self.assertEqual(ctx.reason.code if ctx.reason else None, "UNAVAILABLE")
        await hub2.wait_conn(1, 1)  # after uniform [0, min(2 s, 0.3 s))
        await self.stop_agent(agent, task)

    async def test_redial_after_hub_down(self) -> None:
        agent = self.make_agent()
        task = await self.run_agent(agent)
        port = self.hub.port
        await self.hub.stop()  # closes the link (1001) and stops listening
        await until(lambda: not agent.is_registered, 1, "registration lost")
        await asyncio.sleep(0.3)  # a dial or two refused
        hub2 = FakeHub(heartbeat=0.1)
        hub2.port = port
        await hub2.start()
        self.addAsyncCleanup(hub2.stop)
        await hub2.wait_conn(1, 4)
        await asyncio.wait_for(agent.registered(), 1)
        await self.stop_agent(agent, task)

    async def test_refused_token_ends_run(self) -> None:
        self.hub.refuse_status = 401
        agent = self.make_agent(token="wrong")
        with self.assertRaises(MeshError) as cm:
            await asyncio.wait_for(agent.run(), 3)
        self.assertEqual(cm.exception.code, "UNAUTHENTICATED")
        self.assertEqual(self.hub.authorizations, ["Bearer wrong"])
        self.assertNoSDKTasks()

    async def test_bearer_token(self) -> None:
        agent = self.make_agent(token="s3cret")
        task = await self.run_agent(agent)
        self.assertEqual(self.hub.last.authorization, "Bearer s3cret")
        await self.stop_agent(agent, task)
        no = self.make_agent()
        task = await self.run_agent(no)
        self.assertIsNone(self.hub.last.authorization)
        await self.stop_agent(no, task)

    async def test_no_handlers(self) -> None:
        with self.assertRaises(ValueError):
            await Agent("empty", self.hub.url).run()

    async def test_stop_during_hung_dial(self) -> None:
        async with HungServer() as srv:
            agent = self.make_agent(hubs=srv.url)
            task = asyncio.create_task(agent.run())
            await asyncio.sleep(0.2)
            start = time.monotonic()
            agent.stop()
            await asyncio.wait_for(task, 2)
            self.assertLess(time.monotonic() - start, 0.2)
            self.assertNoSDKTasks()

    async def test_stop_before_registered(self) -> None:
        # a hub that never answers agent.register: stop still ends run
        async def never(conn: Any, f: Any) -> Any:
            await asyncio.Event().wait()

        self.hub.methods["agent.register"] = never
        agent = self.make_agent()
        task = asyncio.create_task(agent.run())
        await until(lambda: self.hub.conns and self.hub.last.requests("agent.register"), 1, "register sent")
        agent.stop()
        await asyncio.wait_for(task, 2)
        await until(lambda: self.hub.last.of_type("cancel"), 1, "the register call cancelled")
        self.assertNoSDKTasks()


class TestServing(AgentTest):
    async def asyncSetUp(self) -> None:
        await super().asyncSetUp()
        self.agent = self.make_agent()
        self.task = await self.run_agent(self.agent)
        self.conn = self.hub.last

    async def test_answers_and_errors(self) -> None:
        c = self.conn
        res = await c.call("t.echo", {"a": [1, "é", None]})
        self.assertEqual(res["result"], {"a": [1, "é", None]})
        self.assertEqual(res["id"], f"req-1-{res['seq']}")
        self.assertEqual((await c.call("t.echo"))["result"], None)
        self.assertNotIn("error", res)

        res = await c.call("t.fail", {"message": "boom"})
        self.assertEqual(res["error"]["code"], "INTERNAL_ERROR")
        self.assertEqual(res["error"]["rpcCode"], -32603)
        self.assertEqual(res["error"]["message"], "boom")
        self.assertNotIn("result", res)

        res = await c.call("t.coded", "k")
        self.assertEqual(res["error"], {"code": "INVALID_PARAMS", "rpcCode": -32602, "message": "bad key",
                                        "retryable": False, "details": {"key": "k"}})

        res = await c.call("t.nothing", {})
        self.assertEqual(res["error"]["code"], "METHOD_NOT_FOUND")
        self.assertIn("t.nothing", res["error"]["message"])

        res = await c.call("t.sync", 7)
        self.assertEqual(res["result"], {"sync": 7})
        res = await c.call("pat.anything", None)
        self.assertEqual(res["result"], {"pattern": "pat.anything"})

        res = await c.call("t.bad", None)
        self.assertEqual(res["error"]["code"], "INTERNAL_ERROR")
        self.assertIn("cannot encode", res["error"]["message"])

        res = await c.call("t.echo", {}, stream=4)
        self.assertEqual(res["error"]["code"], "INVALID_REQUEST")

    async def test_context(self) -> None:
        tp = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
        res = await self.conn.call("t.ctx", {}, headers={"ttl": 2000, "traceparent": tp, "tracestate": "a=1", "baggage": "k=v"},
                                   origin="caller-1")
        r = res["result"]
        self.assertEqual((r["traceparent"], r["tracestate"], r["method"], r["baggage"], r["origin"]),
                         (tp, "a=1", "t.ctx", "k=v", "caller-1"))
        self.assertEqual(r["requestId"], res["id"])
        self.assertTrue(1.5 < r["remaining"] <= 2.0, r["remaining"])
        res = await self.conn.call("t.ctx", {})
        self.assertIsNone(res["result"]["remaining"])
        self.assertIsNone(res["result"]["traceparent"])

    async def test_cancel_frame(self) -> None:
        c = self.conn
        seq, fut, f = c.request("t.sleep", {"ms": 5000, "key": "c1"})
        await c.send(f)
        await asyncio.wait_for(self.events.setdefault("c1", asyncio.Event()).wait(), 1)
        self.assertEqual(self.agent.inflight, 1)
        await c.send({"type": "cancel", "seq": seq})
        res = await asyncio.wait_for(fut, 1)
        ctx = self.contexts["c1.cancelled"]
        self.assertTrue(ctx.cancelled.is_set())
        self.assertEqual(ctx.reason.code if ctx.reason else None, "CANCELLED")
        self.assertEqual(res["error"]["code"], "CANCELLED")
        await until(lambda: self.agent.inflight == 0, 1, "the handler done")
        # a cancel for a seq not served is ignored
        await c.send({"type": "cancel", "seq": 999})
        self.assertEqual((await c.call("t.echo", 1))["result"], 1)

    async def test_ttl_cancels(self) -> None:
        c = self.conn
        start = time.monotonic()
        res = await c.call("t.sleep", {"ms": 5000, "key": "ttl"}, headers={"ttl": 150})
        took = time.monotonic() - start
        self.assertGreaterEqual(took, 0.14)
        self.assertLess(took, 0.6)
        self.assertEqual(res["error"]["code"], "TIMEOUT")
        ctx = self.contexts["ttl.cancelled"]
        self.assertEqual(ctx.reason.code if ctx.reason else None, "TIMEOUT")
        self.assertIsNotNone(ctx.deadline)
        # a ttl longer than the handler: not cancelled
        res = await c.call("t.sleep", {"ms": 20, "key": "ok"}, headers={"ttl": 1000})
        self.assertEqual(res["result"], {"slept": 20})
        self.assertNotIn("ok.cancelled", self.contexts)
        self.assertFalse(self.contexts["ok"].cancelled.is_set())

    async def test_batch(self) -> None:
        c = self.conn
        reqs = [c.request("t.echo", i) for i in range(5)]
        reqs.append(c.request("t.nothing", None))
        await c.send([f for _, _, f in reqs])
        answers = await asyncio.wait_for(asyncio.gather(*(fut for _, fut, _ in reqs)), 2)
        self.assertEqual([a.get("result") for a in answers[:5]], [0, 1, 2, 3, 4])
        self.assertEqual(answers[5]["error"]["code"], "METHOD_NOT_FOUND")
        # the answers, written together, went out as one batch message
        self.assertIn(6, c.message_sizes, c.message_sizes)

    async def test_concurrent(self) -> None:
        c = self.conn
        reqs = [c.request("t.sleep", {"ms": 50, "key": f"k{i}"}) for i in range(50)]
        start = time.monotonic()
        for _, _, f in reqs:
            await c.send(f)
        answers = await asyncio.wait_for(asyncio.gather(*(fut for _, fut, _ in reqs)), 2)
        self.assertLess(time.monotonic() - start, 1.0, "handlers run concurrently")
        self.assertTrue(all(a["result"] == {"slept": 50} for a in answers))
        self.assertEqual(sorted(a["seq"] for a in answers), sorted(seq for seq, _, _ in reqs))

    async def test_garbage_is_ignored(self) -> None:
        c = self.conn
        await c.ws.send("not json")
        await c.send(["not a frame", {"type": "res", "seq": 12345, "result": 1}, {"type": "chunk", "seq": 1}])
        await c.send({"type": "req", "method": "t.echo"})  # no seq: dropped
        res = await c.call("t.echo", "still fine")
        self.assertEqual(res["result"], "still fine")

    async def test_no_task_leak(self) -> None:
        await self.conn.call("t.echo", 1)
        await self.stop_agent(self.agent, self.task)


class TestShutdown(AgentTest):
    async def test_drain_on_stop(self) -> None:
        agent = self.make_agent(drain_timeout=2.0)
        task = await self.run_agent(agent)
        c = self.hub.last
        seq, fut, f = c.request("t.sleep", {"ms": 300, "key": "drain"})
        await c.send(f)
        await asyncio.wait_for(self.events.setdefault("drain", asyncio.Event()).wait(), 1)
        start = time.monotonic()
        agent.stop()
        await asyncio.wait_for(task, 3)
        took = time.monotonic() - start
        res = fut.result()
        self.assertEqual(res["result"], {"slept": 300})
        self.assertGreater(took, 0.2)
        self.assertLess(took, 1.0)
        # deregister went out first, then the answer; then a clean close
        kinds = [(fr.get("type"), fr.get("method")) for fr in c.frames]
        dereg = kinds.index(("req", "agent.deregister"))
        answer = next(i for i, fr in enumerate(c.frames) if fr.get("type") == "res" and fr.get("seq") == seq)
        self.assertLess(dereg, answer)
        self.assertEqual(c.frames[dereg]["params"], {"agentId": "agent-1", "reason": "shutdown"})
        await asyncio.wait_for(c.closed.wait(), 1)
        self.assertEqual(c.close_code, 1000)
        self.assertNotIn("drain.cancelled", self.contexts)
        self.assertNoSDKTasks()

    async def test_drain_timeout(self) -> None:
        agent = self.make_agent(drain_timeout=0.2)
        task = await self.run_agent(agent)
        c = self.hub.last
        seq, fut, f = c.request("t.sleep", {"ms": 10000, "key": "slow"})
        await c.send(f)
        await asyncio.wait_for(self.events.setdefault("slow", asyncio.Event()).wait(), 1)
        start = time.monotonic()
        agent.stop()
        await asyncio.wait_for(task, 3)
        took = time.monotonic() - start
        self.assertGreaterEqual(took, 0.2)
        self.assertLess(took, 1.5)
        ctx = self.contexts["slow.cancelled"]
        self.assertEqual(ctx.reason.code if ctx.reason else None, "UNAVAILABLE")
        self.assertEqual(fut.result()["error"]["code"], "UNAVAILABLE")
        self.assertNoSDKTasks()

    async def test_signal_handlers(self) -> None:
        import signal

        agent = self.make_agent()
        task = asyncio.create_task(agent.run_until_signal())
        await asyncio.wait_for(agent.registered(), 2)
        os.kill(os.getpid(), signal.SIGTERM)
        await asyncio.wait_for(task, 3)
        self.assertTrue(self.hub.last.requests("agent.deregister"))
        # the handlers are removed again
        self.assertFalse(asyncio.get_running_loop().remove_signal_handler(signal.SIGTERM))
        self.assertNoSDKTasks()


class TestGoaway(AgentTest):
    async def test_moves_to_next_hub(self) -> None:
        hub2 = await FakeHub(heartbeat=0.1).start()
        self.addAsyncCleanup(hub2.stop)
        agent = self.make_agent(hubs=[self.hub.url, hub2.url])
        task = await self.run_agent(agent)
        old = self.hub.last
        seq, fut, f = old.request("t.sleep", {"ms": 300, "key": "old"})
        await old.send(f)
        await asyncio.wait_for(self.events.setdefault("old", asyncio.Event()).wait(), 1)
        await old.goaway()
        new = await hub2.wait_conn(1, 2)
        self.assertEqual(new.requests("agent.register")[0]["params"]["agentId"], "agent-1")
        # deregistered on the old link once registered on the new one
        await until(lambda: old.requests("agent.deregister"), 1, "deregister on the draining hub")
        self.assertEqual(old.requests("agent.deregister")[0]["params"]["reason"], "hub draining")
        self.assertLess(new.times[0], old.times[old.frames.index(old.requests("agent.deregister")[0])])
        # the request in flight there is answered, then that link closed
        res = await asyncio.wait_for(fut, 2)
        self.assertEqual(res["result"], {"slept": 300})
        await asyncio.wait_for(old.closed.wait(), 2)
        self.assertEqual(old.close_code, 1000)
        self.assertEqual(agent.hub, hub2.url)
        self.assertEqual((await new.call("t.echo", "here"))["result"], "here")
        self.assertEqual(len(self.hub.conns), 1)
        await self.stop_agent(agent, task)

    async def test_lost_registered_link_moves_within_interval(self) -> None:
        # a registered link lost while another hub is listed: the next hub
        # after uniform [0, min(2 s, interval)) = [0, 0.1 s)
        hub2 = await FakeHub(heartbeat=0.1).start()
        self.addAsyncCleanup(hub2.stop)
        agent = self.make_agent(hubs=[self.hub.url, hub2.url])
        task = await self.run_agent(agent)
        start = time.monotonic()
        self.hub.last.drop()
        await hub2.wait_conn(1, 1)
        self.assertLess(time.monotonic() - start, 0.5)
        await self.stop_agent(agent, task)


if __name__ == "__main__":
    import unittest

    unittest.main()
