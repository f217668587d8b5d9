// @agentmesh/sdk: agents and clients of agentmesh over the agentmesh.v1
// wire protocol (sdk/PROTOCOL.md).

export { Agent, DEFAULT_DRAIN_TIMEOUT_MS, validCapability } from './agent.js';
export { REDIAL_INITIAL_MS, REDIAL_MAX_MS, REDIAL_MIN_MS, REDIAL_SPREAD_MS, Redial, spreadDelay } from './backoff.js';
export { Client, DEFAULT_CALL_TIMEOUT_MS, hubList } from './client.js';
export {
  AGENT_NOT_FOUND,
  CANCELLED,
  CIRCUIT_OPEN,
  CODES,
  ErrorCodes,
  INTERNAL_ERROR,
  INVALID_PARAMS,
  INVALID_REQUEST,
  METHOD_NOT_FOUND,
  MeshError,
  OVERLOADED,
  PARSE_ERROR,
  PERMISSION_DENIED,
  RPC_ERROR,
  TIMEOUT,
  UNAUTHENTICATED,
  UNAVAILABLE,
  codeFromRpcCode,
  isKnownCode,
  isMeshError,
} from './errors.js';
export { DEFAULT_DIAL_TIMEOUT_MS, DEFAULT_HUB_URL, DEFAULT_PING_INTERVAL_MS, ENVELOPE_VERSION, Link, SUBPROTOCOL, newID, silentLogger, wsURL } from './link.js';
export { createLogger } from './logger.js';
export { SDK_VERSION } from './version.js';
