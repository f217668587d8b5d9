"""A small fake hub for the tests: a real WebSocket server on loopback
(websockets.serve, subprotocol agentmesh.v1) that answers agent.register,
agent.heartbeat and agent.deregister, serves methods for client tests,
records every frame, and can call the agents linked to it."""

from __future__ import annotations

import asyncio
import http
import itertools
import json
import os
import sys
import time
import unittest
from typing import Any, Awaitable, Callable

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import logging  # noqa: E402

import websockets  # noqa: E402

from agentmesh import MeshError  # noqa: E402

SUBPROTOCOL = "agentmesh.v1"

if not os.environ.get("AGENTMESH_TEST_LOG"):
    # The SDK's warnings (link lost, handler raised...) are expected here.
    logging.getLogger("agentmesh").addHandler(logging.NullHandler())
    logging.getLogger("agentmesh").propagate = False

#: A method of the fake hub: (conn, request frame) -> result (raise
#: MeshError for an error answer; NO_ANSWER to answer nothing).
Method = Callable[["Conn", dict[str, Any]], Awaitable[Any]]
NO_ANSWER = object()


async def until(pred: Callable[[], Any], timeout: float = 2.0, what: str = "condition") -> None:
    """Polls pred every 5 ms; fails the test if it is not true in time."""
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not true within {timeout} s")
        await asyncio.sleep(0.005)


class HungServer:
    """A TCP server that takes connections and never answers: a hub that
    hangs in the WebSocket upgrade."""

    def __init__(self) -> None:
        self.writers: list[asyncio.StreamWriter] = []
        self.port = 0
        self._server: asyncio.Server | None = None

    async def __aenter__(self) -> "HungServer":
        async def take(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
            self.writers.append(w)

        self._server = await asyncio.start_server(take, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: Any) -> None:
        assert self._server is not None
        self._server.close()
        for w in self.writers:
            w.close()
        await self._server.wait_closed()

    @property
    def url(self) -> str:
        return f"ws://127.0.0.1:{self.port}/ws"


class Conn:
    """One WebSocket the fake hub accepted."""

    def __init__(self, hub: "FakeHub", ws: Any, n: int) -> None:
        self.hub = hub
        self.ws = ws
        self.n = n
        headers = getattr(ws, "request_headers", None)
        if headers is None:
            headers = ws.request.headers
        self.authorization: str | None = headers.get("Authorization")
        #: Every frame received, in order (batches flattened), with the time.
        self.frames: list[dict[str, Any]] = []
        self.times: list[float] = []
        #: How many frames each message held (1 for a lone frame).
        self.message_sizes: list[int] = []
        self._seq = itertools.count(1)
        self._pending: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self.closed = asyncio.Event()
        self.close_code: int | None = None

    # what the agent sent
    def requests(self, method: str | None = None) -> list[dict[str, Any]]:
        return [f for f in self.frames if f.get("type") == "req" and (method is None or f.get("method") == method)]

    def of_type(self, typ: str) -> list[dict[str, Any]]:
        return [f for f in self.frames if f.get("type") == typ]

    # calling the agent
    async def send(self, obj: Any) -> None:
        await self.ws.send(json.dumps(obj))

    def request(self, method: str, params: Any = None, headers: dict[str, Any] | None = None,
                **extra: Any) -> tuple[int, asyncio.Future[dict[str, Any]], dict[str, Any]]:
        """A request frame to the agent, not yet sent, and the future of its
        answer frame."""
        seq = next(self._seq)
        f: dict[str, Any] = {"type": "req", "seq": seq, "id": f"req-{self.n}-{seq}", "method": method, "params": params}
        if headers:
            f["headers"] = headers
        f.update(extra)
        fut: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._pending[seq] = fut
        return seq, fut, f

    async def call(self, method: str, params: Any = None, headers: dict[str, Any] | None = None,
                   timeout: float = 2.0, **extra: Any) -> dict[str, Any]:
        """Calls the agent; returns its answer frame."""
        seq, fut, f = self.request(method, params, headers, **extra)
        await self.send(f)
        return await asyncio.wait_for(fut, timeout)

    def drop(self) -> None:
        """Cuts the TCP connection, no close frame."""
        self.ws.transport.abort()

    def freeze(self) -> None:
        """Stops reading the connection (no frames, no pongs): a hung hub."""
        self.ws.transport.pause_reading()

    async def goaway(self) -> None:
        await self.send({"type": "goaway"})

    # serving
    async def serve(self) -> None:
        try:
            async for msg in self.ws:
                data = json.loads(msg)
                frames = data if isinstance(data, list) else [data]
                self.message_sizes.append(len(frames) if isinstance(data, list) else 1)
                for f in frames:
                    self.frames.append(f)
                    self.times.append(time.monotonic())
                    self._frame(f)
        except websockets.exceptions.ConnectionClosed:
            pass
        finally:
            self.close_code = self.ws.close_code
            self.closed.set()
            for t in list(self._tasks):
                t.cancel()
            if self._tasks:
                await asyncio.gather(*self._tasks, return_exceptions=True)
            for fut in self._pending.values():
                if not fut.done():
                    fut.cancel()

    def _frame(self, f: dict[str, Any]) -> None:
        typ = f.get("type")
        if typ == "res":
            fut = self._pending.pop(f.get("seq"), None)  # type: ignore[arg-type]
            if fut is not None and not fut.done():
                fut.set_result(f)
        elif typ == "req":
            t = asyncio.get_running_loop().create_task(self._answer(f))
            self._tasks.add(t)
            t.add_done_callback(self._tasks.discard)

    async def _answer(self, f: dict[str, Any]) -> None:
        method = f.get("method")
        fn = self.hub.methods.get(method) if isinstance(method, str) else None  # type: ignore[arg-type]
        res: dict[str, Any] = {"type": "res", "seq": f.get("seq"), "id": f.get("id")}
        try:
            if fn is None:
                raise MeshError("METHOD_NOT_FOUND", f"no agent serves {method!r}")
            v = await fn(self, f)
            if v is NO_ANSWER:
                return
            res["result"] = v
        except MeshError as e:
            res["error"] = e.to_wire()
        try:
            await self.send(res)
        except websockets.exceptions.ConnectionClosed:
            pass


class FakeHub:
    """``async with FakeHub() as hub:`` serves on 127.0.0.1 (a free port)."""

    def __init__(self, heartbeat: float = 0.1, liveness: str | None = None,
                 refuse_status: int | None = None) -> None:
        self.heartbeat = heartbeat
        self.liveness = liveness
        #: An HTTP status to refuse every upgrade with (e.g. 401).
        self.refuse_status = refuse_status
        self.conns: list[Conn] = []
        #: Authorization headers of every upgrade attempt (refused ones too).
        self.authorizations: list[str | None] = []
        #: The code of agent.heartbeat's next error answers (and how many).
        self.heartbeat_error: str | None = None
        self.heartbeat_errors = 0
        self.methods: dict[str, Method] = {
            "agent.register": self._register,
            "agent.heartbeat": self._heartbeat,
            "agent.deregister": self._deregister,
        }
        self._server: Any = None
        self.port = 0

    @property
    def url(self) -> str:
        return f"ws://127.0.0.1:{self.port}/ws"

    @property
    def last(self) -> Conn:
        return self.conns[-1]

    async def start(self) -> "FakeHub":
        async def process_request(path: str, headers: Any) -> Any:
            self.authorizations.append(headers.get("Authorization"))
            if self.refuse_status is not None:
                return (http.HTTPStatus(self.refuse_status), [], b"refused\n")
            return None

        self._server = await websockets.serve(  # type: ignore[attr-defined]
            self._handler, "127.0.0.1", self.port, subprotocols=[SUBPROTOCOL],
            process_request=process_request, compression=None, ping_interval=None, close_timeout=0.5,
        )
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None

    async def __aenter__(self) -> "FakeHub":
        return await self.start()

    async def __aexit__(self, *exc: Any) -> None:
        await self.stop()

    async def _handler(self, ws: Any, *path: Any) -> None:
        conn = Conn(self, ws, len(self.conns) + 1)
        self.conns.append(conn)
        await conn.serve()

    def registrations(self) -> list[dict[str, Any]]:
        return [f for c in self.conns for f in c.requests("agent.register")]

    async def wait_conn(self, n: int, timeout: float = 3.0) -> Conn:
        """Waits for the n-th connection (from 1) and its agent.register."""
        await until(lambda: len(self.conns) >= n and self.conns[n - 1].requests("agent.register"), timeout,
                    f"connection {n} registered")
        return self.conns[n - 1]

    async def _register(self, conn: Conn, f: dict[str, Any]) -> Any:
        p = f.get("params") or {}
        out = {
            "agentId": p.get("agentId") or "assigned-id",
            "accepted": True,
            "heartbeatInterval": self.heartbeat,
            "assignedCapabilities": p.get("capabilities"),
        }
        if self.liveness:
            out["liveness"] = self.liveness
        return out

    async def _heartbeat(self, conn: Conn, f: dict[str, Any]) -> Any:
        if self.heartbeat_error and self.heartbeat_errors > 0:
            self.heartbeat_errors -= 1
            raise MeshError(self.heartbeat_error, "agent.heartbeat: agent expired; register again")
        return {"acknowledged": True}

    async def _deregister(self, conn: Conn, f: dict[str, Any]) -> Any:
        return {"acknowledged": True, "gracePeriod": 10}


class LeakCheck(unittest.IsolatedAsyncioTestCase):
    """Fails a test that leaves a task of the agentmesh package running, or
    that makes the event loop report an unhandled error."""

    async def asyncSetUp(self) -> None:
        self.loop_errors: list[dict[str, Any]] = []
        asyncio.get_running_loop().set_exception_handler(lambda loop, ctx: self.loop_errors.append(ctx))

    def assertNoSDKTasks(self) -> None:
        left = []
        for t in asyncio.all_tasks():
            if t is asyncio.current_task() or t.done():
                continue
            code = getattr(t.get_coro(), "cr_code", None)
            if code is not None and os.sep + "agentmesh" + os.sep in code.co_filename:
                left.append(t)
        self.assertEqual(left, [], "tasks of the SDK still running")

    async def asyncTearDown(self) -> None:
        await asyncio.sleep(0)
        self.assertEqual([str(c.get("message")) + " " + repr(c.get("exception")) for c in self.loop_errors], [],
                         "errors reported to the event loop")
