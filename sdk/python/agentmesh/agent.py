"""An agent: registers methods with a hub and serves them (the Go SDK's
``agents.Agent``)."""

from __future__ import annotations

import asyncio
import inspect
import logging
import os
import signal
import socket
import time
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Iterable, TypeVar, Union

from . import _wire
from ._link import Link, new_id
from .backoff import Redial, lost_delay
from .errors import (
    AGENT_NOT_FOUND,
    CANCELLED,
    INTERNAL_ERROR,
    INVALID_REQUEST,
    METHOD_NOT_FOUND,
    PERMISSION_DENIED,
    TIMEOUT,
    UNAUTHENTICATED,
    UNAVAILABLE,
    MeshError,
)

__all__ = ["Agent", "Context", "Handler"]

#: A handler: ``async def h(params, ctx)`` (or a plain function, run in
#: the event loop, or one taking only ``params``).
Handler = Callable[..., Union[Awaitable[Any], Any]]
H = TypeVar("H", bound=Handler)

#: How long an agent.register, agent.heartbeat or agent.deregister call may
#: take (seconds).
REGISTER_TIMEOUT = 10.0
DEREGISTER_TIMEOUT = 2.0


@dataclass(eq=False)
class Context:
    """What a handler knows of the request it serves.

    ``cancelled`` is set when the request's signal fires: a cancel frame
    for it arrived, its ``headers.ttl`` passed, the link was lost, or the
    agent gave up draining. ``reason`` then says why (a MeshError of code
    CANCELLED, TIMEOUT or UNAVAILABLE). The handler's task is cancelled at
    the same moment: a handler that wants to clean up catches
    ``asyncio.CancelledError`` (it may still return a value: it is sent,
    and the hub ignores it) or watches ``cancelled``.
    """

    method: str
    request_id: str
    seq: int
    headers: dict[str, Any]
    traceparent: str | None
    tracestate: str | None
    #: ``time.monotonic()`` by which the caller wants the answer (from
    #: ``headers.ttl``), or None.
    deadline: float | None
    origin: str | None
    hub: str
    cancelled: asyncio.Event = field(default_factory=asyncio.Event)
    reason: MeshError | None = None

    def remaining(self) -> float | None:
        """Seconds left before the deadline (None: no deadline)."""
        return None if self.deadline is None else self.deadline - time.monotonic()

    def _fire(self, reason: MeshError) -> bool:
        if self.cancelled.is_set():
            return False
        self.reason = reason
        self.cancelled.set()
        return True


class _Served:
    """A request an agent serves: its task, context and ttl timer."""

    __slots__ = ("task", "ctx", "timer", "answered")

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self.task: asyncio.Task[None] | None = None
        self.timer: asyncio.TimerHandle | None = None
        self.answered = False

    def abort(self, reason: MeshError) -> None:
        if self.answered or (self.task is not None and self.task.done()):
            return
        if self.ctx._fire(reason) and self.task is not None:
            self.task.cancel()


class _OldLink:
    """The link of a hub that sent goaway, heartbeated by a keeper task
    while the agent registers elsewhere."""

    def __init__(self, link: Link, keeper: asyncio.Task[None]) -> None:
        self.link = link
        self.keeper = keeper


class _Stopped(Exception):
    """The agent was stopped while it awaited something."""


def _takes_ctx(fn: Callable[..., Any]) -> bool:
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return True
    n = 0
    for p in sig.parameters.values():
        if p.kind is p.VAR_POSITIONAL:
            return True
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD):
            n += 1
    return n >= 2


def _valid_capability(c: str) -> None:
    if not c or len(c.encode()) > 256:
        raise ValueError("agentmesh: a method name must be 1 to 256 bytes")
    if any(ch <= " " or ch == "\x7f" for ch in c):
        raise ValueError(f"agentmesh: method {c!r} contains a space or control character")
    i = c.find("*")
    if i >= 0 and (i != len(c) - 1 or (i > 0 and c[i - 1] != ".")):
        raise ValueError(f'agentmesh: method {c!r}: "*" may only end a pattern, as in "memory.*"')


class Agent:
    """Serves methods on the mesh.

    Register handlers with :meth:`method` (a decorator) or :meth:`handle`,
    then ``await agent.run()``: it connects to the hubs (tried in turn),
    registers, heartbeats and serves until :meth:`stop` (or SIGTERM/SIGINT
    with :meth:`run_until_signal`); after a lost link it reconnects after
    a jittered delay and registers again with the same agent id.
    """

    def __init__(
        self,
        name: str,
        hubs: str | list[str] | None = None,
        token: str | None = None,
        agent_id: str | None = None,
        drain_timeout: float = 5.0,
        logger: logging.Logger | None = None,
        metadata: dict[str, Any] | None = None,
        ping_interval: float | None = _wire.PING_INTERVAL,
    ) -> None:
        from . import __version__

        self.name = name
        self.hubs = [_wire.ws_url(h) for h in _wire.split_hubs(hubs)]
        self.token = token or None
        self._id = agent_id or new_id()
        self.drain_timeout = drain_timeout
        #: How often the agent pings its hub (seconds; None: never); a hub
        #: that answers no ping for two intervals is gone.
        self.ping_interval = ping_interval
        self.log = logger or logging.getLogger("agentmesh")
        self.metadata: dict[str, Any] = {
            "sdk": "python",
            "version": __version__,
            "hostname": socket.gethostname(),
            "pid": os.getpid(),
        }
        if metadata:
            self.metadata.update(metadata)
        self._exact: dict[str, tuple[Handler, bool]] = {}
        self._patterns: list[tuple[str, Handler, bool]] = []
        self._stopping = False
        self._stop_ev = asyncio.Event()
        self._wake = asyncio.Event()
        self._registered_ev = asyncio.Event()
        self._running = False
        self._tasks: set[asyncio.Task[None]] = set()
        self._tasks_empty = asyncio.Event()
        self._tasks_empty.set()
        self._drains: set[asyncio.Task[None]] = set()
        self._links: set[Link] = set()
        #: The heartbeat interval the hub assigned (seconds), once registered.
        self.heartbeat_interval: float | None = None
        #: Whether the hub takes the link for the heartbeat (liveness "link").
        self.link_liveness = False
        #: The hub the agent is registered with (None while it is not).
        self.hub: str | None = None
        self._last_activity = int(time.time() * 1000)

    # -- methods ---------------------------------------------------------

    @property
    def agent_id(self) -> str:
        """The agent's id (the one the hub assigned, once registered)."""
        return self._id

    def handle(self, method: str, fn: Handler) -> None:
        """Serves a method name, or a ``prefix.*`` pattern, with fn."""
        _valid_capability(method)
        entry = (fn, _takes_ctx(fn))
        if method.endswith("*"):
            prefix = method[:-1]
            self._patterns = [p for p in self._patterns if p[0] != prefix]
            self._patterns.append((prefix, fn, entry[1]))
            self._patterns.sort(key=lambda p: len(p[0]), reverse=True)
        else:
            self._exact[method] = entry

    def method(self, *names: str) -> Callable[[H], H]:
        """Decorator: ``@agent.method("py.echo")`` serves py.echo with the
        decorated ``async def handler(params, ctx)``."""
        if not names:
            raise ValueError("agentmesh: method() needs at least one method name")

        def deco(fn: H) -> H:
            for n in names:
                self.handle(n, fn)
            return fn

        return deco

    def methods(self) -> list[str]:
        """The methods and patterns served, sorted."""
        return sorted([*self._exact, *(p + "*" for p, _, _ in self._patterns)])

    def _lookup(self, method: str) -> tuple[Handler, bool] | None:
        h = self._exact.get(method)
        if h is not None:
            return h
        for prefix, fn, takes in self._patterns:
            if method.startswith(prefix):
                return fn, takes
        return None

    # -- state -----------------------------------------------------------

    async def registered(self) -> None:
        """Returns once the agent is registered with a hub."""
        await self._registered_ev.wait()

    @property
    def is_registered(self) -> bool:
        return self._registered_ev.is_set()

    @property
    def inflight(self) -> int:
        """Handlers running."""
        return len(self._tasks)

    def stop(self) -> None:
        """Asks :meth:`run` to shut down: deregister, drain the handlers in
        flight (at most ``drain_timeout``), close the link and return. Safe
        to call from a signal handler installed with
        ``loop.add_signal_handler`` and before run()."""
        self._stopping = True
        self._stop_ev.set()
        self._wake.set()

    def install_signal_handlers(
        self, sigs: Iterable[signal.Signals] = (signal.SIGTERM, signal.SIGINT)
    ) -> Callable[[], None]:
        """Makes SIGTERM and SIGINT call :meth:`stop` (loop.add_signal_handler,
        Unix only); returns a function that removes them."""
        loop = asyncio.get_running_loop()
        installed = []
        for s in sigs:
            loop.add_signal_handler(s, self.stop)
            installed.append(s)

        def remove() -> None:
            for s in installed:
                loop.remove_signal_handler(s)

        return remove

    async def run_until_signal(self) -> None:
        """:meth:`run`, stopped gracefully by SIGTERM or SIGINT."""
        remove = self.install_signal_handlers()
        try:
            await self.run()
        finally:
            remove()

    # -- the run loop ----------------------------------------------------

    async def run(self) -> None:
        """Connects, registers, heartbeats and serves until :meth:`stop`.
        Raises MeshError UNAUTHENTICATED or PERMISSION_DENIED when a hub
        refuses the agent's credentials (trying again cannot help)."""
        if self._running:
            raise RuntimeError("agentmesh: Agent.run is already running")
        if not self._exact and not self._patterns:
            raise ValueError("agentmesh: no handlers registered")
        self._running = True
        bo = Redial()
        prev: _OldLink | None = None
        i = 0
        try:
            while not self._stopping:
                hub = self.hubs[i % len(self.hubs)]
                i += 1
                registered, nxt, err = await self._session(hub, prev)
                if registered:
                    prev = None  # the session retired it
                    bo.reset()
                if self._stopping:
                    if nxt is not None:
                        prev = nxt
                    return
                if nxt is not None:
                    # The hub is draining: register on the next hub at once;
                    # the old link is retired once that succeeded.
                    self.log.info("agentmesh: hub %s is draining (goaway); moving to the next hub", hub)
                    if prev is not None:
                        self._retire(prev)
                    prev = nxt
                    continue
                if err is not None and err.code in (UNAUTHENTICATED, PERMISSION_DENIED):
                    self.log.error("agentmesh: hub %s refused this agent's credentials: %s", hub, err)
                    raise err
                d = bo.next()
                if registered and len(self.hubs) > 1:
                    d = lost_delay(self.heartbeat_interval)
                if registered:
                    self.log.warning("agentmesh: link to hub %s lost (%s); reconnecting in %.2f s", hub, err, d)
                else:
                    self.log.warning("agentmesh: no link to hub %s (%s); trying again in %.2f s", hub, err, d)
                await self._sleep(d)
        finally:
            if prev is not None:
                self._retire(prev)
            await self._finish_run()

    async def _finish_run(self) -> None:
        try:
            if self._drains:
                await asyncio.gather(*self._drains, return_exceptions=True)
        finally:
            # Anything left (handlers that ignored their cancellation):
            # cancel and await, so that no task outlives run().
            for t in list(self._tasks):
                t.cancel()
            if self._tasks:
                await asyncio.wait(list(self._tasks), timeout=1.0)
            for link in list(self._links):
                await link.close()
            self._links.clear()
            self._registered_ev.clear()
            self.hub = None
            self._running = False

    async def _sleep(self, d: float) -> None:
        try:
            async with asyncio.timeout(d):
                await self._stop_ev.wait()
        except TimeoutError:
            pass

    async def _race(self, aw: Awaitable[Any]) -> Any:
        """Awaits aw unless the agent is stopped first (then aw is
        cancelled and _Stopped raised)."""
        task = asyncio.ensure_future(aw)
        stop = asyncio.ensure_future(self._stop_ev.wait())
        try:
            await asyncio.wait({task, stop}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stop.cancel()
            if not task.done():
                task.cancel()
            await asyncio.gather(stop, return_exceptions=True)
        if task.cancelled() or not task.done():
            await asyncio.gather(task, return_exceptions=True)
            raise _Stopped()
        return task.result()

    async def _session(self, hub: str, prev: _OldLink | None) -> tuple[bool, _OldLink | None, MeshError | None]:
        """One link's life: dial, register, heartbeat, serve. Once
        registered it retires prev (make before break). On a goaway it
        returns the link, still open and heartbeated, as the second value."""
        self.log.debug("agentmesh: dialing hub %s as %s", hub, self._id)
        try:
            ws = await self._race(_wire.dial(hub, self.token))
        except _Stopped:
            return False, None, None
        except MeshError as e:
            return False, None, e
        link = Link(ws, hub, logger=self.log, on_request=self._on_request, on_event=self._wake.set,
                    ping_interval=self.ping_interval)
        self._links.add(link)
        keep_open = False
        registered = False
        try:
            try:
                interval, live = await self._race(self._register(link))
            except _Stopped:
                return False, None, None
            except MeshError as e:
                return False, None, e
            registered = True
            self._registered_ev.set()
            self.hub = hub
            if prev is not None:
                self._retire(prev)
            self.log.info(
                "registered hub=%s agent=%s name=%s methods=%s heartbeat=%gs liveness=%s",
                hub, self._id, self.name, ",".join(self.methods()), interval, "link" if live else "heartbeat",
            )
            loop = asyncio.get_running_loop()
            next_beat = loop.time() + interval
            while True:
                self._wake.clear()
                if link.closed.is_set():
                    return True, None, link.error
                if self._stopping:
                    await self._shutdown(link)
                    return True, None, None
                if link.goaway.is_set():
                    keep_open = True
                    keeper = asyncio.get_running_loop().create_task(self._keeper(link, interval))
                    return True, _OldLink(link, keeper), None
                if not live and loop.time() >= next_beat:
                    next_beat = loop.time() + interval
                    try:
                        await self._race(self._heartbeat(link, interval))
                    except _Stopped:
                        continue
                    except MeshError as e:
                        if e.code != AGENT_NOT_FOUND:
                            if not link.closed.is_set():
                                self.log.warning("agentmesh: heartbeat failed: %s", e)
                            continue
                        # The hub expired us (a pause longer than its TTL):
                        # register again on the same link.
                        self.log.warning("agentmesh: the hub expired this agent; registering again")
                        try:
                            interval, live = await self._race(self._register(link))
                        except _Stopped:
                            continue
                        except MeshError as e2:
                            return True, None, e2
                        next_beat = loop.time() + interval
                    continue
                timeout = None if live else max(0.0, next_beat - loop.time())
                try:
                    async with asyncio.timeout(timeout):
                        await self._wake.wait()
                except TimeoutError:
                    pass
        finally:
            if registered:
                self._registered_ev.clear()
                self.hub = None
            if not keep_open:
                await link.close()
                self._links.discard(link)

    async def _register(self, link: Link) -> tuple[float, bool]:
        p = {
            "agentId": self._id,
            "name": self.name,
            "capabilities": self.methods(),
            "intents": ["serve"],
            "metadata": self.metadata,
        }
        res = await link.call("agent.register", p, timeout=REGISTER_TIMEOUT)
        if not isinstance(res, dict) or res.get("accepted") is not True:
            raise MeshError(UNAVAILABLE, "the hub did not accept the registration")
        aid = res.get("agentId")
        if isinstance(aid, str) and aid:
            self._id = aid
        iv = res.get("heartbeatInterval")
        interval = float(iv) if isinstance(iv, (int, float)) and not isinstance(iv, bool) and iv > 0 else 5.0
        live = res.get("liveness") == "link"
        self.heartbeat_interval = interval
        self.link_liveness = live
        return interval, live

    async def _heartbeat(self, link: Link, interval: float) -> None:
        p = {
            "agentId": self._id,
            "status": {
                "state": "ready",
                "queuedRequests": len(self._tasks),
                "lastActivity": self._last_activity,
            },
        }
        await link.call("agent.heartbeat", p, timeout=interval)

    async def _keeper(self, link: Link, interval: float) -> None:
        """Heartbeats a draining hub's link until it is retired, so that
        the hub does not expire the agent (and fail the requests it still
        serves there) before the move is done."""
        while True:
            try:
                async with asyncio.timeout(interval):
                    await link.closed.wait()
                return
            except TimeoutError:
                pass
            if self.link_liveness:
                continue
            try:
                await self._heartbeat(link, interval)
            except MeshError as e:
                if not link.closed.is_set():
                    self.log.debug("agentmesh: heartbeat on a draining hub failed: %s", e)

    def _retire(self, old: _OldLink) -> None:
        t = asyncio.get_running_loop().create_task(self._retire_run(old))
        self._drains.add(t)
        t.add_done_callback(self._drains.discard)

    async def _retire_run(self, old: _OldLink) -> None:
        """Leaves a draining hub's link: stops heartbeating there,
        deregisters there (only the hub's binding goes: the registration
        moved) and closes the link once the requests it serves are
        answered (at most the drain timeout)."""
        link = old.link
        old.keeper.cancel()
        await asyncio.gather(old.keeper, return_exceptions=True)
        try:
            await link.call("agent.deregister", {"agentId": self._id, "reason": "hub draining"}, timeout=DEREGISTER_TIMEOUT)
        except MeshError as e:
            if not link.closed.is_set():
                self.log.warning("agentmesh: deregistering from the draining hub %s failed: %s", link.url, e)
        try:
            if not await link.wait_idle(self.drain_timeout):
                self.log.warning("agentmesh: drain of the link to %s timed out", link.url)
                for s in list(link.serving.values()):
                    s.abort(MeshError(UNAVAILABLE, "the hub is draining and the agent's drain timed out"))
            await link.flush(1.0)
        finally:
            await link.close()
            self._links.discard(link)

    async def _shutdown(self, link: Link) -> None:
        """Deregisters, waits for the handlers in flight (at most the drain
        timeout), sends their answers; the caller closes the link."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.drain_timeout
        self._registered_ev.clear()
        self.log.info("agentmesh: shutting down: deregistering, then draining %d handlers in flight", len(self._tasks))
        try:
            await link.call(
                "agent.deregister",
                {"agentId": self._id, "reason": "shutdown"},
                timeout=max(0.001, min(DEREGISTER_TIMEOUT, self.drain_timeout)),
            )
        except MeshError as e:
            self.log.warning("agentmesh: deregister failed: %s", e)
        try:
            async with asyncio.timeout(max(0.0, deadline - loop.time())):
                await self._tasks_empty.wait()
        except TimeoutError:
            self.log.warning("agentmesh: drain timed out with %d handlers in flight", len(self._tasks))
            for links in list(self._links):
                for s in list(links.serving.values()):
                    s.abort(MeshError(UNAVAILABLE, "the agent is shutting down and its drain timed out"))
            if self._tasks:
                await asyncio.wait(list(self._tasks), timeout=1.0)
        # The handlers have returned, but their answers may still wait in
        # the link's queue: close the link only once they are written.
        await link.flush(max(1.0, deadline - loop.time()))
        self.log.debug("agentmesh: drained; closing the link")

    # -- serving ---------------------------------------------------------

    def _on_request(self, link: Link, seq: int, f: dict[str, Any]) -> None:
        rid = f.get("id")
        rid = rid if isinstance(rid, str) else ""
        method = f.get("method")
        if not isinstance(method, str) or not method:
            link.answer_error(seq, rid, MeshError(INVALID_REQUEST, "a request needs a method"))
            return
        if f.get("stream") is not None:
            link.answer_error(seq, rid, MeshError(INVALID_REQUEST, f"{method}: this agent serves no streams; call it without one"))
            return
        entry = self._lookup(method)
        if entry is None:
            link.answer_error(seq, rid, MeshError(METHOD_NOT_FOUND, f"agent {self._id} does not serve {method!r}"))
            return
        if seq in link.serving:
            self.log.warning("agentmesh: dropping a request that reuses seq %d, still served", seq)
            return
        headers = f.get("headers")
        if not isinstance(headers, dict):
            headers = {}
        ttl = headers.get("ttl")
        ttl_s = ttl / 1000 if isinstance(ttl, (int, float)) and not isinstance(ttl, bool) and ttl > 0 else None
        tp, ts, origin = headers.get("traceparent"), headers.get("tracestate"), f.get("origin")
        ctx = Context(
            method=method,
            request_id=rid,
            seq=seq,
            headers=headers,
            traceparent=tp if isinstance(tp, str) else None,
            tracestate=ts if isinstance(ts, str) else None,
            deadline=None if ttl_s is None else time.monotonic() + ttl_s,
            origin=origin if isinstance(origin, str) else None,
            hub=link.url,
        )
        s = _Served(ctx)
        loop = asyncio.get_running_loop()
        fn, takes_ctx = entry
        task = loop.create_task(self._serve(link, s, fn, takes_ctx, f.get("params")), name=f"agentmesh {method} #{seq}")
        s.task = task
        if ttl_s is not None:
            s.timer = loop.call_later(ttl_s, s.abort, MeshError(TIMEOUT, f"the call's ttl of {ttl} ms passed"))
        link.add_served(seq, s)
        self._tasks.add(task)
        self._tasks_empty.clear()
        self._last_activity = int(time.time() * 1000)
        task.add_done_callback(lambda t: self._served(link, s, t))

    async def _serve(self, link: Link, s: _Served, fn: Handler, takes_ctx: bool, params: Any) -> None:
        ctx = s.ctx
        try:
            v = fn(params, ctx) if takes_ctx else fn(params)
            if inspect.isawaitable(v):
                v = await v
        except asyncio.CancelledError:
            reason = ctx.reason or MeshError(CANCELLED, "the handler was cancelled")
            s.answered = True
            link.answer_error(ctx.seq, ctx.request_id, reason)
            if ctx.reason is None:
                raise  # not our signal: someone else cancels this task
            return
        except MeshError as e:
            s.answered = True
            link.answer_error(ctx.seq, ctx.request_id, e)
            return
        except Exception as e:
            self.log.warning("agentmesh: handler for %s raised %s: %s", ctx.method, type(e).__name__, e)
            s.answered = True
            link.answer_error(ctx.seq, ctx.request_id, MeshError(INTERNAL_ERROR, str(e) or type(e).__name__))
            return
        s.answered = True
        try:
            link.answer(ctx.seq, ctx.request_id, v)
        except (TypeError, ValueError) as e:
            link.answer_error(ctx.seq, ctx.request_id, MeshError(INTERNAL_ERROR, f"cannot encode the result of {ctx.method}: {e}"))

    def _served(self, link: Link, s: _Served, task: asyncio.Task[None]) -> None:
        if s.timer is not None:
            s.timer.cancel()
        if not s.answered:
            # Cancelled before it ran (or while cancelled by someone else).
            s.answered = True
            link.answer_error(s.ctx.seq, s.ctx.request_id, s.ctx.reason or MeshError(CANCELLED, "the handler was cancelled"))
        link.remove_served(s.ctx.seq, s)
        self._tasks.discard(task)
        if not self._tasks:
            self._tasks_empty.set()
        self._last_activity = int(time.time() * 1000)
        if not task.cancelled():
            exc = task.exception()  # retrieved, so never "never retrieved"
            if exc is not None:
                self.log.error("agentmesh: serving %s failed", s.ctx.method, exc_info=exc)
