"""agentmesh: the Python (asyncio) SDK of the agentmesh RPC mesh.

An :class:`Agent` registers methods with a hub and serves them; a
:class:`Client` calls methods through a hub. Both speak the agentmesh.v1
WebSocket protocol (sdk/PROTOCOL.md) with the ``websockets`` package.
"""

from __future__ import annotations

__version__ = "0.1.0"

from ._duration import parse_duration
from ._wire import DEFAULT_HUB, SUBPROTOCOL, ws_url
from .agent import Agent, Context, Handler
from .backoff import Redial, lost_delay
from .client import Client
from .errors import (
    AGENT_NOT_FOUND,
    CANCELLED,
    CIRCUIT_OPEN,
    CODES,
    INTERNAL_ERROR,
    INVALID_PARAMS,
    INVALID_REQUEST,
    METHOD_NOT_FOUND,
    OVERLOADED,
    PARSE_ERROR,
    PERMISSION_DENIED,
    RPC_ERROR,
    TIMEOUT,
    UNAUTHENTICATED,
    UNAVAILABLE,
    MeshError,
)

__all__ = [
    "__version__",
    "Agent",
    "Client",
    "Context",
    "Handler",
    "MeshError",
    "Redial",
    "lost_delay",
    "ws_url",
    "parse_duration",
    "DEFAULT_HUB",
    "SUBPROTOCOL",
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
