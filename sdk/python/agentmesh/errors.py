"""The mesh's error codes and its one exception type, :class:`MeshError`."""

from __future__ import annotations

from typing import Any, Final, Mapping

__all__ = [
    "MeshError",
    "CODES",
    "PARSE_ERROR",
    "INVALID_REQUEST",
    "METHOD_NOT_FOUND",
    "INVALID_PARAMS",
    "INTERNAL_ERROR",
    "RPC_ERROR",
    "AGENT_NOT_FOUND",
    "UNAVAILABLE",
    "TIMEOUT",
    "CIRCUIT_OPEN",
    "OVERLOADED",
    "CANCELLED",
    "UNAUTHENTICATED",
    "PERMISSION_DENIED",
]

PARSE_ERROR: Final = "PARSE_ERROR"
INVALID_REQUEST: Final = "INVALID_REQUEST"
METHOD_NOT_FOUND: Final = "METHOD_NOT_FOUND"
INVALID_PARAMS: Final = "INVALID_PARAMS"
INTERNAL_ERROR: Final = "INTERNAL_ERROR"
RPC_ERROR: Final = "RPC_ERROR"
AGENT_NOT_FOUND: Final = "AGENT_NOT_FOUND"
UNAVAILABLE: Final = "UNAVAILABLE"
TIMEOUT: Final = "TIMEOUT"
CIRCUIT_OPEN: Final = "CIRCUIT_OPEN"
OVERLOADED: Final = "OVERLOADED"
CANCELLED: Final = "CANCELLED"
UNAUTHENTICATED: Final = "UNAUTHENTICATED"
PERMISSION_DENIED: Final = "PERMISSION_DENIED"

#: code -> (JSON-RPC number, retryable). TIMEOUT is retryable for
#: idempotent calls only; on the wire it is sent as retryable, as the Go
#: hub does.
CODES: Final[Mapping[str, tuple[int, bool]]] = {
    PARSE_ERROR: (-32700, False),
    INVALID_REQUEST: (-32600, False),
    METHOD_NOT_FOUND: (-32601, False),
    INVALID_PARAMS: (-32602, False),
    INTERNAL_ERROR: (-32603, False),
    RPC_ERROR: (-32000, False),
    AGENT_NOT_FOUND: (-32001, False),
    UNAVAILABLE: (-32002, True),
    TIMEOUT: (-32003, True),
    CIRCUIT_OPEN: (-32004, True),
    OVERLOADED: (-32005, True),
    CANCELLED: (-32006, False),
    UNAUTHENTICATED: (-32007, False),
    PERMISSION_DENIED: (-32008, False),
}

_BY_RPC: Final[Mapping[int, str]] = {n: c for c, (n, _) in CODES.items()}


class MeshError(Exception):
    """An error of the mesh: a symbolic ``code`` from :data:`CODES`, a
    message safe to send over the wire, and optional ``details``.

    Raise it from a handler to answer with that code; :meth:`agentmesh.Client.call`
    raises it for every failed call.
    """

    code: str
    message: str
    rpc_code: int
    retryable: bool
    not_sent: bool
    details: Any

    def __init__(
        self,
        code: str,
        message: str = "",
        *,
        details: Any = None,
        not_sent: bool = False,
        retryable: bool | None = None,
    ) -> None:
        if code not in CODES:
            code = RPC_ERROR
        super().__init__(f"{code}: {message}" if message else code)
        self.code = code
        self.message = message
        self.rpc_code, default_retryable = CODES[code]
        self.retryable = default_retryable if retryable is None else retryable
        self.not_sent = not_sent
        self.details = details

    def __repr__(self) -> str:
        return f"MeshError({self.code!r}, {self.message!r})"

    def to_wire(self) -> dict[str, Any]:
        """The error object of a ``res`` frame."""
        out: dict[str, Any] = {
            "code": self.code,
            "rpcCode": self.rpc_code,
            "message": self.message,
            "retryable": self.retryable,
        }
        if self.not_sent:
            out["notSent"] = True
        if self.details is not None:
            out["details"] = self.details
        return out

    @classmethod
    def from_wire(cls, obj: Any) -> "MeshError":
        """Decodes a ``res`` frame's error object. The symbolic code wins
        over the number; a code this SDK does not know is RPC_ERROR."""
        if not isinstance(obj, dict):
            return cls(RPC_ERROR, "malformed error object")
        code = obj.get("code")
        if not isinstance(code, str) or code not in CODES:
            num = obj.get("rpcCode", code)
            code = _BY_RPC.get(num, RPC_ERROR) if isinstance(num, int) else RPC_ERROR
        msg = obj.get("message")
        retryable = obj.get("retryable")
        return cls(
            code,
            msg if isinstance(msg, str) else "",
            details=obj.get("details"),
            not_sent=obj.get("notSent") is True,
            retryable=retryable if isinstance(retryable, bool) else None,
        )
