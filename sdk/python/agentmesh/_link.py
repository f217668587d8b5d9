"""A link: one WebSocket to a hub speaking agentmesh.v1 frames, both ways.

It numbers this side's requests, matches their answers by seq, hands the
peer's requests to a callback, routes the peer's cancel frames to the
requests this side serves, writes outgoing frames from one writer task
(frames queued while it writes go out together as one batch message), and
pings the hub (a hub that answers no ping for two intervals is gone).
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from typing import Any, Callable, Final, Protocol

from . import _wire
from .errors import CANCELLED, INTERNAL_ERROR, INVALID_REQUEST, METHOD_NOT_FOUND, TIMEOUT, UNAVAILABLE, MeshError

#: A batch message holds at most this many characters (at most 4 bytes
#: each in UTF-8: under the hub's 1 MiB).
BATCH_CHARS: Final = 192 << 10
#: The protocol version sent in requests (the Go envelope's).
ENVELOPE_VERSION: Final = "1.0"


class Served(Protocol):
    """A request this side serves, as the link sees it."""

    def abort(self, reason: MeshError) -> None:
        """Fires the request's signal (cancel frame, link lost)."""


RequestHandler = Callable[["Link", int, dict[str, Any]], None]


def new_id() -> str:
    return str(uuid.uuid4())


class Link:
    """One WebSocket to a hub. Create it inside a running event loop."""

    def __init__(
        self,
        ws: _wire.WebSocket,
        url: str,
        *,
        logger: logging.Logger,
        on_request: RequestHandler | None = None,
        on_event: Callable[[], None] | None = None,
        ping_interval: float | None = _wire.PING_INTERVAL,
    ) -> None:
        self.ws = ws
        self.url = url
        self.log = logger
        self._on_request = on_request
        self._on_event = on_event
        self._seq = 0
        self._pending: dict[int, asyncio.Future[Any]] = {}
        #: Requests this side serves, by the peer's seq.
        self.serving: dict[int, Served] = {}
        self._serving_empty = asyncio.Event()
        self._serving_empty.set()
        self._pending_empty = asyncio.Event()
        self._pending_empty.set()
        self._out: list[str] = []
        self._out_ready = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        #: Set once the link is lost or closed; ``error`` says why.
        self.closed = asyncio.Event()
        self.error: MeshError | None = None
        #: Set once the peer sent a goaway frame.
        self.goaway = asyncio.Event()
        loop = asyncio.get_running_loop()
        self._writer = loop.create_task(self._write(), name=f"agentmesh writer {url}")
        self._reader = loop.create_task(self._read(), name=f"agentmesh reader {url}")
        self._pinger: asyncio.Task[None] | None = None
        if ping_interval:
            self._pinger = loop.create_task(self._ping(ping_interval), name=f"agentmesh pinger {url}")

    # -- sending ---------------------------------------------------------

    def send(self, frame: dict[str, Any]) -> bool:
        """Queues a frame; False if the link is closed (the frame is
        dropped). Raises TypeError/ValueError if frame is not JSON."""
        if self.closed.is_set():
            return False
        self._out.append(_wire.encode(frame))
        self._idle.clear()
        self._out_ready.set()
        return True

    def answer(self, seq: int, request_id: str, result: Any) -> None:
        frame: dict[str, Any] = {"type": "res", "seq": seq, "result": result}
        if request_id:
            frame["id"] = request_id
        self.send(frame)

    def answer_error(self, seq: int, request_id: str, err: MeshError) -> None:
        frame: dict[str, Any] = {"type": "res", "seq": seq, "error": err.to_wire()}
        if request_id:
            frame["id"] = request_id
        try:
            self.send(frame)
        except (TypeError, ValueError):  # details that are not JSON
            frame["error"] = MeshError(err.code, err.message).to_wire()
            self.send(frame)

    async def _write(self) -> None:
        try:
            while True:
                await self._out_ready.wait()
                self._out_ready.clear()
                if self.closed.is_set():
                    return
                while self._out:
                    batch, self._out = self._out, []
                    for msg in _pack(batch):
                        await self.ws.send(msg)
                self._idle.set()
        except _wire.ConnectionClosed:
            pass
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a bug, or a transport failure
            self.log.warning("agentmesh: writing to %s failed: %s", self.url, exc)
            self._lost(MeshError(UNAVAILABLE, f"writing to hub {self.url} failed: {exc}"))
        finally:
            self._idle.set()

    async def flush(self, timeout: float | None = None) -> bool:
        """Waits until every queued frame is written (or the link closed);
        False on timeout."""
        try:
            async with asyncio.timeout(timeout):
                await self._idle.wait()
            return True
        except TimeoutError:
            return False

    # -- calls -----------------------------------------------------------

    async def call(
        self,
        method: str,
        params: Any = None,
        *,
        timeout: float | None = None,
        headers: dict[str, Any] | None = None,
        request_id: str | None = None,
    ) -> Any:
        """Sends a request and awaits its answer's result. Raises MeshError
        (the answer's error; UNAVAILABLE if the link is lost; TIMEOUT after
        ``timeout`` seconds, after sending a cancel frame). If the awaiting
        task is cancelled it sends a cancel frame and re-raises."""
        if self.closed.is_set():
            raise self._lost_error(not_sent=True)
        self._seq += 1
        seq = self._seq
        hdrs = dict(headers) if headers else {}
        if timeout is not None:
            if timeout <= 0:
                raise MeshError(TIMEOUT, f"{method}: the deadline passed before the call was sent", not_sent=True)
            hdrs["ttl"] = max(1, int(timeout * 1000))
        frame: dict[str, Any] = {
            "type": "req",
            "seq": seq,
            "id": request_id or new_id(),
            "method": method,
            "params": params,
            "timestamp": int(time.time() * 1000),
            "version": ENVELOPE_VERSION,
        }
        if hdrs:
            frame["headers"] = hdrs
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        try:
            self.send(frame)
        except (TypeError, ValueError) as exc:
            raise MeshError(INVALID_REQUEST, f"{method}: params are not JSON: {exc}", not_sent=True) from exc
        self._pending[seq] = fut
        self._pending_empty.clear()
        try:
            if timeout is None:
                return await fut
            async with asyncio.timeout(timeout):
                return await fut
        except TimeoutError:
            self._cancel(seq)
            raise MeshError(TIMEOUT, f"{method}: no answer within {timeout:g} s") from None
        except asyncio.CancelledError:
            self._cancel(seq)
            raise
        finally:
            if self._pending.pop(seq, None) is not None and not self._pending:
                self._pending_empty.set()

    def _cancel(self, seq: int) -> None:
        if seq in self._pending and not self.closed.is_set():
            self.send({"type": "cancel", "seq": seq})

    @property
    def pending(self) -> int:
        """Calls awaiting an answer."""
        return len(self._pending)

    async def wait_idle(self, timeout: float | None) -> bool:
        """Waits until this link serves no request and awaits no answer
        (or is closed); False on timeout."""
        try:
            async with asyncio.timeout(timeout):
                while not self.closed.is_set() and (self.serving or self._pending):
                    await self._serving_empty.wait()
                    await self._pending_empty.wait()
            return True
        except TimeoutError:
            return False

    # -- serving (the agent registers what it serves) --------------------

    def add_served(self, seq: int, s: Served) -> None:
        self.serving[seq] = s
        self._serving_empty.clear()

    def remove_served(self, seq: int, s: Served) -> None:
        if self.serving.get(seq) is s:
            del self.serving[seq]
            if not self.serving:
                self._serving_empty.set()

    # -- reading ---------------------------------------------------------

    async def _read(self) -> None:
        why = "closed"
        try:
            while True:
                msg = await self.ws.recv()
                try:
                    data = _wire.decode(msg)
                except ValueError as exc:
                    self.log.warning("agentmesh: dropping an undecodable message from %s: %s", self.url, exc)
                    continue
                if isinstance(data, list):
                    for f in data:
                        self._frame(f)
                else:
                    self._frame(data)
        except _wire.ConnectionClosed as exc:
            why = _close_text(exc)
        except asyncio.CancelledError:
            why = "closed"
            raise
        except Exception as exc:
            why = f"{type(exc).__name__}: {exc}"
            self.log.warning("agentmesh: reading from %s failed: %s", self.url, why)
        finally:
            self._lost(MeshError(UNAVAILABLE, f"link to hub {self.url} lost: {why}"))

    def _frame(self, f: Any) -> None:
        if not isinstance(f, dict):
            self.log.warning("agentmesh: dropping a frame that is not an object from %s", self.url)
            return
        typ = f.get("type")
        seq = f.get("seq")
        if typ in ("res", "end"):
            fut = self._pending.pop(seq, None) if type(seq) is int else None
            if not self._pending:
                self._pending_empty.set()
            if fut is None or fut.done():
                return  # an answer to a call given up on
            err = f.get("error")
            if err is not None:
                fut.set_exception(MeshError.from_wire(err))
            else:
                fut.set_result(f.get("result"))
        elif typ == "req":
            if type(seq) is not int or seq < 1:
                self.log.warning("agentmesh: dropping a request without a valid seq from %s", self.url)
                return
            if self._on_request is None:
                self.answer_error(seq, _str(f.get("id")), MeshError(METHOD_NOT_FOUND, "this peer serves no methods"))
                return
            try:
                self._on_request(self, seq, f)
            except Exception as exc:  # a bug in the request handler
                self.log.exception("agentmesh: serving a request failed")
                self.answer_error(seq, _str(f.get("id")), MeshError(INTERNAL_ERROR, str(exc) or type(exc).__name__))
        elif typ == "cancel":
            s = self.serving.get(seq) if type(seq) is int else None
            if s is not None:
                s.abort(MeshError(CANCELLED, "the caller cancelled the call"))
        elif typ == "goaway":
            if not self.goaway.is_set():
                self.goaway.set()
                if self._on_event is not None:
                    self._on_event()
        # chunk, credit and unknown frames: not used by this SDK.

    async def _ping(self, interval: float) -> None:
        """Pings the hub every interval after the last pong; a hub that
        answers none for two intervals is gone: the link is lost at once
        and its socket aborted."""
        try:
            while not self.closed.is_set():
                await asyncio.sleep(interval)
                try:
                    async with asyncio.timeout(interval):
                        pong = await self.ws.ping()
                        await pong
                except TimeoutError:
                    self._lost(MeshError(UNAVAILABLE, f"link to hub {self.url} lost: no pong for {2 * interval:g} s"))
                    self._abort()
                    return
        except asyncio.CancelledError:
            raise
        except _wire.ConnectionClosed:
            pass
        except Exception as exc:  # the connection failed under the ping
            self.log.debug("agentmesh: pinging %s failed: %s", self.url, exc)

    def _abort(self) -> None:
        transport = getattr(self.ws, "transport", None)
        if transport is not None:
            transport.abort()

    # -- the end ---------------------------------------------------------

    def _lost_error(self, not_sent: bool = False) -> MeshError:
        e = self.error
        return MeshError(UNAVAILABLE, e.message if e else f"link to hub {self.url} closed", not_sent=not_sent)

    def _lost(self, err: MeshError) -> None:
        if self.closed.is_set():
            return
        self.error = err
        self.closed.set()
        pending, self._pending = self._pending, {}
        self._pending_empty.set()
        for fut in pending.values():
            if not fut.done():
                fut.set_exception(self._lost_error())
        for s in list(self.serving.values()):
            s.abort(MeshError(UNAVAILABLE, err.message))
        self._out.clear()
        self._out_ready.set()
        self._serving_empty.set()
        if self._on_event is not None:
            self._on_event()

    async def close(self, code: int = 1000, reason: str = "") -> None:
        """Closes the link: calls awaiting answers fail UNAVAILABLE, the
        signals of the requests it serves fire, frames not yet written are
        dropped (flush first). Waits for its tasks."""
        self._lost(MeshError(UNAVAILABLE, f"link to hub {self.url} closed"))
        try:
            async with asyncio.timeout(3):
                await self.ws.close(code, reason)
        except (TimeoutError, Exception):
            self._abort()
        tasks = [t for t in (self._writer, self._reader, self._pinger) if t is not None]
        for t in tasks:
            if not t.done():
                t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)



def _str(v: Any) -> str:
    return v if isinstance(v, str) else ""


def _close_text(exc: BaseException) -> str:
    rcvd = getattr(exc, "rcvd", None)
    if rcvd is not None:
        code = getattr(rcvd, "code", None)
        reason = getattr(rcvd, "reason", "")
        return f"closed by the hub ({code}{': ' + reason if reason else ''})"
    code = getattr(exc, "code", None)  # websockets 10.4 before rcvd existed
    if isinstance(code, int) and code not in (1005, 1006):
        return f"closed ({code})"
    return "connection lost"


def _pack(frames: list[str]) -> list[str]:
    """One message per frame, or batches (JSON arrays) under BATCH_CHARS."""
    if len(frames) == 1:
        return frames
    out: list[str] = []
    cur: list[str] = []
    size = 0
    for f in frames:
        if cur and size + len(f) + 1 > BATCH_CHARS:
            out.append(cur[0] if len(cur) == 1 else "[" + ",".join(cur) + "]")
            cur, size = [], 0
        cur.append(f)
        size += len(f) + 1
    if cur:
        out.append(cur[0] if len(cur) == 1 else "[" + ",".join(cur) + "]")
    return out
