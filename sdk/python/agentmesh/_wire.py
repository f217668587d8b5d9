"""The WebSocket under a link: hub URLs, dialling (websockets 10.4's legacy
API, or the asyncio API of websockets >= 14), JSON encoding."""

from __future__ import annotations

import asyncio
import json
import urllib.parse
from typing import Any, Final, Protocol

import websockets
import websockets.exceptions

from .errors import PERMISSION_DENIED, UNAUTHENTICATED, UNAVAILABLE, INVALID_REQUEST, MeshError

SUBPROTOCOL: Final = "agentmesh.v1"
DEFAULT_HUB: Final = "ws://127.0.0.1:7700/ws"
#: Largest message the hub takes by default (1 MiB).
MAX_MESSAGE: Final = 1 << 20
#: How often a link pings the hub (PING_INTERVAL after the last pong);
#: the hub is gone when a ping waits longer than another interval for its
#: pong, i.e. after two intervals without one (the link's own pinger, not
#: websockets' keepalive, which takes seconds more to report the loss).
PING_INTERVAL: Final = 5.0
DIAL_TIMEOUT: Final = 10.0


def _version() -> tuple[int, ...]:
    out = []
    for part in str(getattr(websockets, "__version__", "0")).split(".")[:2]:
        digits = "".join(ch for ch in part if ch.isdigit())
        out.append(int(digits or 0))
    return tuple(out)


#: websockets >= 14 has the new asyncio implementation as its default API.
NEW_API: Final = _version() >= (14,)


class WebSocket(Protocol):
    """What a link uses of a websockets connection (both APIs have it)."""

    subprotocol: Any

    async def send(self, message: str) -> None: ...

    async def recv(self) -> str | bytes: ...

    async def close(self, code: int = 1000, reason: str = "") -> None: ...


ConnectionClosed = websockets.exceptions.ConnectionClosed


def ws_url(hub: str) -> str:
    """Normalises a hub address as the Go SDK does: ``host:port``,
    ``http://host:port`` and ``ws://host:port`` all become
    ``ws://host:port/ws`` (https becomes wss); an explicit path is kept."""
    if "://" not in hub:
        hub = "ws://" + hub
    u = urllib.parse.urlsplit(hub)
    scheme = {"ws": "ws", "wss": "wss", "http": "ws", "https": "wss"}.get(u.scheme.lower())
    if scheme is None:
        raise MeshError(INVALID_REQUEST, f"hub URL {hub!r}: scheme must be ws, wss, http or https", not_sent=True)
    if not u.netloc:
        raise MeshError(INVALID_REQUEST, f"hub URL {hub!r} has no host", not_sent=True)
    path = u.path
    if path in ("", "/", "/rpc"):
        path = "/ws"
    return urllib.parse.urlunsplit((scheme, u.netloc, path, u.query, u.fragment))


def split_hubs(hubs: str | list[str] | tuple[str, ...] | None) -> list[str]:
    """A list of hub URLs from a URL, a comma-separated list or a list."""
    if hubs is None:
        return [DEFAULT_HUB]
    items = [hubs] if isinstance(hubs, str) else list(hubs)
    out: list[str] = []
    for item in items:
        out.extend(p.strip() for p in item.split(",") if p.strip())
    return out or [DEFAULT_HUB]


def _status_of(exc: BaseException) -> int | None:
    status = getattr(exc, "status_code", None)  # legacy InvalidStatusCode
    if status is None:
        resp = getattr(exc, "response", None)  # new API's InvalidStatus
        status = getattr(resp, "status_code", None)
    return status if isinstance(status, int) else None


async def dial(url: str, token: str | None = None, *, timeout: float = DIAL_TIMEOUT) -> WebSocket:
    """Opens a WebSocket to a hub's /ws offering ``agentmesh.v1`` (and the
    token as ``Authorization: Bearer``). Failures are MeshError:
    UNAUTHENTICATED (401), PERMISSION_DENIED (403), else UNAVAILABLE (a
    dial that outlives timeout too)."""
    u = ws_url(url)
    headers = {"Authorization": "Bearer " + token} if token else None
    kwargs: dict[str, Any] = dict(
        subprotocols=[SUBPROTOCOL],
        ping_interval=None,  # the link pings (Link._ping)
        ping_timeout=None,
        close_timeout=2,
        max_size=MAX_MESSAGE,
        compression=None,
    )
    try:
        if NEW_API:
            from websockets.asyncio.client import connect as new_connect

            ws: Any = await new_connect(u, additional_headers=headers, open_timeout=timeout, **kwargs)
        else:
            ws = await _dial_legacy(u, headers, timeout, kwargs)
    except asyncio.CancelledError:
        raise
    except Exception as exc:  # websockets' InvalidHandshake family, OSError, TimeoutError
        status = _status_of(exc)
        if status in (401, 403):
            code = UNAUTHENTICATED if status == 401 else PERMISSION_DENIED
            raise MeshError(code, f"hub {u} refused the WebSocket: HTTP {status}") from exc
        if status is not None:
            raise MeshError(UNAVAILABLE, f"hub {u} refused the WebSocket: HTTP {status}", not_sent=True) from exc
        text = str(exc) or type(exc).__name__
        if isinstance(exc, TimeoutError):
            text = f"no WebSocket within {timeout:g} s"
        raise MeshError(UNAVAILABLE, f"cannot reach hub {u}: {text}", not_sent=True) from exc
    if ws.subprotocol != SUBPROTOCOL:
        await ws.close()
        raise MeshError(UNAVAILABLE, f"hub {u} does not speak {SUBPROTOCOL}", not_sent=True)
    return ws  # type: ignore[no-any-return]


async def _dial_legacy(u: str, headers: dict[str, str] | None, timeout: float, kwargs: dict[str, Any]) -> Any:
    """websockets 10.4's connect, bounded by timeout. When the bound (or a
    cancellation) comes during the opening handshake, the half-open socket
    is aborted first: websockets would otherwise wait close_timeout for the
    hub to close it before giving up."""
    from websockets.legacy.client import WebSocketClientProtocol

    protocols: list[Any] = []

    def create_protocol(*args: Any, **kw: Any) -> Any:
        p = WebSocketClientProtocol(*args, **kw)
        protocols.append(p)
        return p

    task = asyncio.ensure_future(websockets.connect(  # type: ignore[attr-defined]
        u, extra_headers=headers, open_timeout=None, create_protocol=create_protocol, **kwargs))
    try:
        done, _ = await asyncio.wait({task}, timeout=timeout)
    finally:
        if not task.done():
            for p in protocols:
                transport = getattr(p, "transport", None)
                if transport is not None:
                    transport.abort()
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
    if not done:
        raise TimeoutError()
    return task.result()


_encoder = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False)


def encode(obj: Any) -> str:
    """Compact JSON, UTF-8 as is."""
    return _encoder.encode(obj)


def decode(text: str | bytes) -> Any:
    return json.loads(text)
