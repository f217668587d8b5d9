"""MeshError, the redial schedule, hub URLs, durations: no sockets."""

from __future__ import annotations

import os
import random
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import agentmesh  # noqa: E402
from agentmesh import MeshError, Redial, lost_delay, parse_duration, ws_url  # noqa: E402
from agentmesh._link import _pack  # noqa: E402


class FixedRandom(random.Random):
    def __init__(self, value: float) -> None:
        super().__init__()
        self.value = value

    def random(self) -> float:
        return self.value


class TestMeshError(unittest.TestCase):
    def test_table(self) -> None:
        want = {
            "PARSE_ERROR": (-32700, False), "INVALID_REQUEST": (-32600, False),
            "METHOD_NOT_FOUND": (-32601, False), "INVALID_PARAMS": (-32602, False),
            "INTERNAL_ERROR": (-32603, False), "RPC_ERROR": (-32000, False),
            "AGENT_NOT_FOUND": (-32001, False), "UNAVAILABLE": (-32002, True),
            "TIMEOUT": (-32003, True), "CIRCUIT_OPEN": (-32004, True), "OVERLOADED": (-32005, True),
            "CANCELLED": (-32006, False), "UNAUTHENTICATED": (-32007, False),
            "PERMISSION_DENIED": (-32008, False),
        }
        self.assertEqual(dict(agentmesh.CODES), want)
        for code, (num, retryable) in want.items():
            self.assertEqual(getattr(agentmesh, code), code)
            e = MeshError(code, "m")
            self.assertEqual((e.code, e.rpc_code, e.retryable, e.not_sent), (code, num, retryable, False))

    def test_str_and_wire(self) -> None:
        e = MeshError("INVALID_PARAMS", "bad key", details={"field": "key"}, not_sent=True)
        self.assertEqual(str(e), "INVALID_PARAMS: bad key")
        self.assertEqual(e.to_wire(), {"code": "INVALID_PARAMS", "rpcCode": -32602, "message": "bad key",
                                       "retryable": False, "notSent": True, "details": {"field": "key"}})
        back = MeshError.from_wire(e.to_wire())
        self.assertEqual((back.code, back.message, back.details, back.not_sent), ("INVALID_PARAMS", "bad key", {"field": "key"}, True))
        self.assertEqual(str(MeshError("TIMEOUT")), "TIMEOUT")

    def test_from_wire_unknown_codes(self) -> None:
        self.assertEqual(MeshError.from_wire({"code": "NEW_CODE", "message": "x"}).code, "RPC_ERROR")
        self.assertEqual(MeshError.from_wire({"code": "NEW_CODE", "rpcCode": -32005}).code, "OVERLOADED")
        self.assertEqual(MeshError.from_wire({"code": -32003}).code, "TIMEOUT")
        self.assertEqual(MeshError.from_wire("junk").code, "RPC_ERROR")
        e = MeshError.from_wire({"code": "TIMEOUT", "retryable": False})
        self.assertFalse(e.retryable)
        self.assertEqual(MeshError("NOPE").code, "RPC_ERROR")


class TestRedial(unittest.TestCase):
    def test_ceilings(self) -> None:
        # Uniform [100 ms, ceiling]: the ceiling stays 1 s for four tries,
        # then grows x1.5 to 5 s.
        top = Redial(FixedRandom(0.999999999))
        got = [round(top.next(), 3) for _ in range(10)]
        self.assertEqual(got, [1.0, 1.0, 1.0, 1.0, 1.5, 2.25, 3.375, 5.0, 5.0, 5.0])
        bottom = Redial(FixedRandom(0.0))
        self.assertEqual({bottom.next() for _ in range(10)}, {0.1})

    def test_bounds_random(self) -> None:
        r = Redial()
        for i in range(200):
            d = r.next()
            self.assertGreaterEqual(d, 0.1)
            self.assertLessEqual(d, 1.0 if i < 4 else 5.0)
        r.reset()
        self.assertEqual(r.ceiling(), 1.0)
        self.assertLessEqual(r.next(), 1.0)

    def test_lost_delay(self) -> None:
        for _ in range(200):
            self.assertLess(lost_delay(None), 2.0)
            self.assertLess(lost_delay(0.5), 0.5)
            self.assertLess(lost_delay(10), 2.0)
            self.assertGreaterEqual(lost_delay(0.5), 0.0)
        self.assertAlmostEqual(lost_delay(0.5, FixedRandom(0.5)), 0.25)


class TestURLs(unittest.TestCase):
    def test_ws_url(self) -> None:
        self.assertEqual(ws_url("127.0.0.1:7700"), "ws://127.0.0.1:7700/ws")
        self.assertEqual(ws_url("http://h:1"), "ws://h:1/ws")
        self.assertEqual(ws_url("https://h:1/rpc"), "wss://h:1/ws")
        self.assertEqual(ws_url("ws://h:1/"), "ws://h:1/ws")
        self.assertEqual(ws_url("ws://h:1/custom"), "ws://h:1/custom")
        with self.assertRaises(MeshError):
            ws_url("ftp://h:1")

    def test_hubs_lists(self) -> None:
        c = agentmesh.Client("a:1,b:2")
        self.assertEqual(c.hubs, ["ws://a:1/ws", "ws://b:2/ws"])
        a = agentmesh.Agent("x", ["ws://a:1/ws", "b:2"])
        self.assertEqual(a.hubs, ["ws://a:1/ws", "ws://b:2/ws"])
        self.assertEqual(agentmesh.Agent("x").hubs, [agentmesh.DEFAULT_HUB])


class TestDuration(unittest.TestCase):
    def test_parse(self) -> None:
        self.assertEqual(parse_duration("5s"), 5.0)
        self.assertEqual(parse_duration("500ms"), 0.5)
        self.assertEqual(parse_duration("1m30s"), 90.0)
        self.assertEqual(parse_duration("2"), 2.0)
        for bad in ("", "5x", "s", "-1s", "1s2"):
            with self.assertRaises(ValueError, msg=bad):
                parse_duration(bad)


class TestPack(unittest.TestCase):
    def test_batches(self) -> None:
        self.assertEqual(_pack(['{"a":1}']), ['{"a":1}'])
        self.assertEqual(_pack(['{"a":1}', '{"b":2}']), ['[{"a":1},{"b":2}]'])
        big = '"' + "x" * (60 << 10) + '"'
        out = _pack([big, big, big, big])
        self.assertEqual(len(out), 2)  # 192 Ki characters at most per message
        self.assertEqual(out[0], "[" + ",".join([big] * 3) + "]")
        self.assertEqual(out[1], big)
        huge = '"' + "x" * (300 << 10) + '"'
        self.assertEqual(_pack([big, huge, big]), [big, huge, big])


class TestHandlers(unittest.TestCase):
    def test_names(self) -> None:
        a = agentmesh.Agent("x")
        a.handle("x.echo", lambda p: p)
        a.handle("x.more.*", lambda p: p)
        a.handle("x.*", lambda p, ctx: p)
        self.assertEqual(a.methods(), ["x.*", "x.echo", "x.more.*"])
        self.assertEqual(a._lookup("x.more.y")[0].__code__.co_argcount, 1)  # type: ignore[index,attr-defined]
        self.assertTrue(a._lookup("x.other")[1])  # type: ignore[index]
        self.assertIsNone(a._lookup("y.echo"))
        for bad in ("", "a b", "x*", "x.*.y"):
            with self.assertRaises(ValueError, msg=bad):
                a.handle(bad, lambda p: p)


if __name__ == "__main__":
    unittest.main()
