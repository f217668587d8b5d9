"""A client: calls methods through a hub."""

from __future__ import annotations

import asyncio
import logging
from types import TracebackType
from typing import Any

from . import _wire
from ._link import Link
from .errors import PERMISSION_DENIED, TIMEOUT, UNAUTHENTICATED, UNAVAILABLE, MeshError

__all__ = ["Client"]


class Client:
    """Calls methods through a hub over one WebSocket, dialled at the first
    call. A lost link fails the calls awaiting answers on it with
    UNAVAILABLE; the next call dials again, the next URL of the list first.

    Use it as ``async with Client("ws://127.0.0.1:7700/ws") as c:`` or call
    :meth:`close` when done.
    """

    def __init__(
        self,
        hubs: str | list[str] | None = None,
        token: str | None = None,
        timeout: float = 30.0,
        logger: logging.Logger | None = None,
        ping_interval: float | None = _wire.PING_INTERVAL,
    ) -> None:
        self.hubs = [_wire.ws_url(h) for h in _wire.split_hubs(hubs)]
        self.token = token or None
        self.timeout = timeout
        #: How often the client pings its hub (seconds; None: never); a hub
        #: that answers no ping for two intervals is gone.
        self.ping_interval = ping_interval
        self.log = logger or logging.getLogger("agentmesh")
        self._link: Link | None = None
        self._next = 0  # index of the hub the next dial tries first
        self._lock = asyncio.Lock()
        self._closed = False
        self._retiring: set[asyncio.Task[None]] = set()

    async def __aenter__(self) -> "Client":
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    @property
    def hub(self) -> str | None:
        """The hub of the current link, if any."""
        link = self._link
        return link.url if link is not None and not link.closed.is_set() else None

    async def call(
        self,
        method: str,
        params: Any = None,
        timeout: float | None = None,
        traceparent: str | None = None,
        tracestate: str | None = None,
        headers: dict[str, Any] | None = None,
    ) -> Any:
        """Calls method with params (any JSON value) and returns its result.

        ``timeout`` (seconds; default the client's) travels as
        ``headers.ttl``; when it passes first the call is cancelled at the
        hub (a cancel frame) and MeshError TIMEOUT raised. If the awaiting
        task is cancelled, a cancel frame is sent and CancelledError
        re-raised. ``headers`` adds envelope headers (e.g. ``baggage``,
        ``correlationId``). Raises MeshError for every failure.
        """
        if self._closed:
            raise MeshError(UNAVAILABLE, "the client is closed", not_sent=True)
        t = self.timeout if timeout is None else timeout
        loop = asyncio.get_running_loop()
        deadline = loop.time() + t if t is not None and t > 0 else None
        link = await self._get_link(deadline, method)
        h: dict[str, Any] = dict(headers) if headers else {}
        if traceparent:
            h["traceparent"] = traceparent
        if tracestate:
            h["tracestate"] = tracestate
        left = None if deadline is None else deadline - loop.time()
        if left is not None and left <= 0:
            raise MeshError(TIMEOUT, f"{method}: the deadline passed while dialling the hub", not_sent=True)
        return await link.call(method, params, timeout=left, headers=h or None)

    async def _get_link(self, deadline: float | None, method: str) -> Link:
        link = self._link
        if link is not None and not link.closed.is_set() and not link.goaway.is_set():
            return link
        async with self._lock:
            link = self._link
            if link is not None and not link.closed.is_set() and not link.goaway.is_set():
                return link
            if link is not None:
                self._link = None
                self._next += 1  # after a loss (or a goaway), the next hub first
                self._retire(link)
            if self._closed:
                raise MeshError(UNAVAILABLE, "the client is closed", not_sent=True)
            loop = asyncio.get_running_loop()
            last: MeshError | None = None
            for k in range(len(self.hubs)):
                i = (self._next + k) % len(self.hubs)
                left = _wire.DIAL_TIMEOUT if deadline is None else min(_wire.DIAL_TIMEOUT, deadline - loop.time())
                if left <= 0:
                    if last is not None:
                        raise last  # a dial that took the call's time is UNAVAILABLE, not sent
                    raise MeshError(TIMEOUT, f"{method}: the deadline passed while dialling the hub", not_sent=True)
                try:
                    ws = await _wire.dial(self.hubs[i], self.token, timeout=left)
                except MeshError as e:
                    if e.code in (UNAUTHENTICATED, PERMISSION_DENIED):
                        raise
                    last = e
                    continue
                self._next = i
                self._link = Link(ws, self.hubs[i], logger=self.log, ping_interval=self.ping_interval)
                return self._link
            assert last is not None
            raise last

    def _retire(self, link: Link) -> None:
        """Closes a link once the calls awaiting answers on it are done
        (at once if it is lost)."""

        async def retire() -> None:
            try:
                await link.wait_idle(None)
            finally:
                await link.close()

        t = asyncio.get_running_loop().create_task(retire())
        self._retiring.add(t)
        t.add_done_callback(self._retiring.discard)

    async def close(self) -> None:
        """Closes the link: calls still awaiting answers fail UNAVAILABLE."""
        self._closed = True
        link, self._link = self._link, None
        if link is not None:
            await link.close()
        for t in list(self._retiring):
            t.cancel()
        if self._retiring:
            await asyncio.gather(*self._retiring, return_exceptions=True)
