// The mesh's error codes (sdk/PROTOCOL.md, "Error codes") and MeshError,
// the one error type the SDK throws and sends.

export const PARSE_ERROR = 'PARSE_ERROR';
export const INVALID_REQUEST = 'INVALID_REQUEST';
export const METHOD_NOT_FOUND = 'METHOD_NOT_FOUND';
export const INVALID_PARAMS = 'INVALID_PARAMS';
export const INTERNAL_ERROR = 'INTERNAL_ERROR';
export const RPC_ERROR = 'RPC_ERROR';
export const AGENT_NOT_FOUND = 'AGENT_NOT_FOUND';
export const UNAVAILABLE = 'UNAVAILABLE';
export const TIMEOUT = 'TIMEOUT';
export const CIRCUIT_OPEN = 'CIRCUIT_OPEN';
export const OVERLOADED = 'OVERLOADED';
export const CANCELLED = 'CANCELLED';
export const UNAUTHENTICATED = 'UNAUTHENTICATED';
export const PERMISSION_DENIED = 'PERMISSION_DENIED';

/**
 * Every code with its JSON-RPC number and retry class: "never", "always",
 * or "idempotent" (the call may have run: retry idempotent methods only).
 */
export const CODES = Object.freeze({
  PARSE_ERROR: Object.freeze({ rpcCode: -32700, retry: 'never' }),
  INVALID_REQUEST: Object.freeze({ rpcCode: -32600, retry: 'never' }),
  METHOD_NOT_FOUND: Object.freeze({ rpcCode: -32601, retry: 'never' }),
  INVALID_PARAMS: Object.freeze({ rpcCode: -32602, retry: 'never' }),
  INTERNAL_ERROR: Object.freeze({ rpcCode: -32603, retry: 'never' }),
  RPC_ERROR: Object.freeze({ rpcCode: -32000, retry: 'never' }),
  AGENT_NOT_FOUND: Object.freeze({ rpcCode: -32001, retry: 'never' }),
  UNAVAILABLE: Object.freeze({ rpcCode: -32002, retry: 'always' }),
  TIMEOUT: Object.freeze({ rpcCode: -32003, retry: 'idempotent' }),
  CIRCUIT_OPEN: Object.freeze({ rpcCode: -32004, retry: 'always' }),
  OVERLOADED: Object.freeze({ rpcCode: -32005, retry: 'always' }),
  CANCELLED: Object.freeze({ rpcCode: -32006, retry: 'never' }),
  UNAUTHENTICATED: Object.freeze({ rpcCode: -32007, retry: 'never' }),
  PERMISSION_DENIED: Object.freeze({ rpcCode: -32008, retry: 'never' }),
});

/** The symbolic codes by name (ErrorCodes.TIMEOUT === "TIMEOUT"). */
export const ErrorCodes = Object.freeze(Object.fromEntries(Object.keys(CODES).map((c) => [c, c])));

const byRpcCode = new Map(Object.entries(CODES).map(([c, row]) => [row.rpcCode, c]));

/** The code of a JSON-RPC number; RPC_ERROR when it is not in the table. */
export function codeFromRpcCode(n) {
  return byRpcCode.get(n) ?? RPC_ERROR;
}

/** Whether code is one of the table's codes. */
export function isKnownCode(code) {
  return typeof code === 'string' && Object.hasOwn(CODES, code);
}

/**
 * An error of the mesh: a symbolic code from the table, its JSON-RPC
 * number, whether a retry may succeed, whether the request provably never
 * reached a handler (notSent: safe to retry), and optional details (any
 * JSON). Thrown by Client.call; thrown by a handler, it is sent with its
 * code.
 */
export class MeshError extends Error {
  /**
   * @param {string} code a code of the table (an unknown one becomes RPC_ERROR)
   * @param {string} [message]
   * @param {{details?: unknown, notSent?: boolean, retryable?: boolean, cause?: unknown}} [opts]
   */
  constructor(code, message = '', opts = {}) {
    super(message, opts.cause !== undefined ? { cause: opts.cause } : undefined);
    if (!isKnownCode(code)) code = RPC_ERROR;
    this.name = 'MeshError';
    /** The symbolic code, e.g. "TIMEOUT". */
    this.code = code;
    /** The code's JSON-RPC number, e.g. -32003. */
    this.rpcCode = CODES[code].rpcCode;
    /** Whether a retry may succeed (TIMEOUT: for idempotent calls only). */
    this.retryable = opts.retryable ?? CODES[code].retry !== 'never';
    /** The request provably never reached a handler: safe to retry. */
    this.notSent = opts.notSent === true;
    /** Structured details (any JSON), or undefined. */
    this.details = opts.details;
  }

  /** The error object of a "res" frame. */
  toWire() {
    const o = { code: this.code, rpcCode: this.rpcCode, message: this.message, retryable: this.retryable };
    if (this.notSent) o.notSent = true;
    if (this.details !== undefined) o.details = this.details;
    return o;
  }

  toJSON() {
    return this.toWire();
  }

  /**
   * The MeshError of a "res" frame's error object: the symbolic code wins
   * over the number; a code not in the table is RPC_ERROR.
   */
  static fromWire(o) {
    if (o === null || typeof o !== 'object' || Array.isArray(o)) {
      return new MeshError(RPC_ERROR, 'malformed error object from peer');
    }
    let code;
    if (isKnownCode(o.code)) code = o.code;
    else if (Number.isInteger(o.rpcCode)) code = codeFromRpcCode(o.rpcCode);
    else if (Number.isInteger(o.code)) code = codeFromRpcCode(o.code);
    else code = RPC_ERROR;
    const message = typeof o.message === 'string' ? o.message : '';
    const opts = { notSent: o.notSent === true };
    if (o.details !== undefined && o.details !== null) opts.details = o.details;
    if (typeof o.retryable === 'boolean') opts.retryable = o.retryable;
    return new MeshError(code, message, opts);
  }

  /**
   * The MeshError a handler's failure is sent as: a MeshError keeps its
   * code; anything else thrown is INTERNAL_ERROR with its message.
   */
  static from(err) {
    if (err instanceof MeshError) return err;
    if (err instanceof Error && err.name === 'MeshError' && isKnownCode(err.code)) {
      // One from another copy of this SDK.
      return new MeshError(err.code, err.message, { details: err.details, notSent: err.notSent, cause: err });
    }
    if (err instanceof Error) return new MeshError(INTERNAL_ERROR, err.message, { cause: err });
    return new MeshError(INTERNAL_ERROR, String(err), { cause: err });
  }
}

/** Whether err is a MeshError with the given code. */
export function isMeshError(err, code) {
  return err instanceof MeshError && (code === undefined || err.code === code);
}
