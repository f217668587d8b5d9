// Type declarations of @agentmesh/sdk (hand-written; the code is plain
// JavaScript in the .js files beside this one).

import { EventEmitter } from 'node:events';

// ---------------------------------------------------------------- errors

/** A symbolic error code of the mesh's table (sdk/PROTOCOL.md). */
export type ErrorCode =
  | 'PARSE_ERROR'
  | 'INVALID_REQUEST'
  | 'METHOD_NOT_FOUND'
  | 'INVALID_PARAMS'
  | 'INTERNAL_ERROR'
  | 'RPC_ERROR'
  | 'AGENT_NOT_FOUND'
  | 'UNAVAILABLE'
  | 'TIMEOUT'
  | 'CIRCUIT_OPEN'
  | 'OVERLOADED'
  | 'CANCELLED'
  | 'UNAUTHENTICATED'
  | 'PERMISSION_DENIED';

export const PARSE_ERROR: 'PARSE_ERROR';
export const INVALID_REQUEST: 'INVALID_REQUEST';
export const METHOD_NOT_FOUND: 'METHOD_NOT_FOUND';
export const INVALID_PARAMS: 'INVALID_PARAMS';
export const INTERNAL_ERROR: 'INTERNAL_ERROR';
export const RPC_ERROR: 'RPC_ERROR';
export const AGENT_NOT_FOUND: 'AGENT_NOT_FOUND';
export const UNAVAILABLE: 'UNAVAILABLE';
export const TIMEOUT: 'TIMEOUT';
export const CIRCUIT_OPEN: 'CIRCUIT_OPEN';
export const OVERLOADED: 'OVERLOADED';
export const CANCELLED: 'CANCELLED';
export const UNAUTHENTICATED: 'UNAUTHENTICATED';
export const PERMISSION_DENIED: 'PERMISSION_DENIED';

/** Whether a failed call may be tried again: never, always, or for idempotent methods only. */
export type RetryClass = 'never' | 'always' | 'idempotent';

/** Every code with its JSON-RPC number and retry class. */
export const CODES: Readonly<Record<ErrorCode, Readonly<{ rpcCode: number; retry: RetryClass }>>>;
/** The codes by name: ErrorCodes.TIMEOUT === "TIMEOUT". */
export const ErrorCodes: Readonly<{ [C in ErrorCode]: C }>;

/** The code of a JSON-RPC number; RPC_ERROR when it is not in the table. */
export function codeFromRpcCode(n: number): ErrorCode;
/** Whether code is one of the table's codes. */
export function isKnownCode(code: unknown): code is ErrorCode;
/** Whether err is a MeshError (with the given code, if any). */
export function isMeshError(err: unknown, code?: ErrorCode): err is MeshError;

/** The error object of a "res" frame. */
export interface WireError {
  code: ErrorCode | string;
  rpcCode?: number;
  message?: string;
  retryable?: boolean;
  notSent?: boolean;
  details?: unknown;
  [key: string]: unknown;
}

export interface MeshErrorOptions {
  details?: unknown;
  notSent?: boolean;
  retryable?: boolean;
  cause?: unknown;
}

/**
 * An error of the mesh. Client.call rejects with one; thrown by a handler
 * it is sent with its code (anything else thrown is INTERNAL_ERROR with
 * its message).
 */
export class MeshError extends Error {
  /** @param code a code of the table (an unknown one becomes RPC_ERROR) */
  constructor(code: ErrorCode | string, message?: string, opts?: MeshErrorOptions);
  readonly name: 'MeshError';
  /** The symbolic code, e.g. "TIMEOUT". */
  code: ErrorCode;
  /** Its JSON-RPC number, e.g. -32003. */
  rpcCode: number;
  /** Whether a retry may succeed (TIMEOUT: for idempotent calls only). */
  retryable: boolean;
  /** The request provably never reached a handler: safe to retry. */
  notSent: boolean;
  /** Structured details (any JSON), if any. */
  details: unknown;
  /** The error object of a "res" frame. */
  toWire(): WireError;
  toJSON(): WireError;
  /** The MeshError of a "res" frame's error object (the symbolic code wins over the number). */
  static fromWire(o: unknown): MeshError;
  /** A MeshError as is; anything else as INTERNAL_ERROR with its message. */
  static from(err: unknown): MeshError;
}

// ---------------------------------------------------------------- logging

export interface Logger {
  debug(message: string, fields?: Record<string, unknown>): void;
  info(message: string, fields?: Record<string, unknown>): void;
  warn(message: string, fields?: Record<string, unknown>): void;
  error(message: string, fields?: Record<string, unknown>): void;
}

/** A logger that drops everything (the default). */
export const silentLogger: Logger;

/** A logger writing one line per entry at level or above to stream (process.stderr). */
export function createLogger(opts?: { level?: 'debug' | 'info' | 'warn' | 'error'; stream?: { write(s: string): unknown } }): Logger;

// ---------------------------------------------------------------- backoff

export const REDIAL_MIN_MS: 100;
export const REDIAL_INITIAL_MS: 1000;
export const REDIAL_MAX_MS: 5000;
export const REDIAL_SPREAD_MS: 2000;

/**
 * The redial schedule: full jitter, each delay uniform in [100 ms,
 * ceiling]; the ceiling is 1 s for four tries, then grows ×1.5 up to 5 s.
 */
export class Redial {
  constructor(random?: () => number);
  /** Tries so far. */
  n: number;
  /** The ceiling of the next delay (ms). */
  ceiling(): number;
  /** The next delay (ms). */
  next(): number;
  /** Starts the schedule again. */
  reset(): void;
}

/** Uniform [0, min(2 s, intervalMs)): the delay before moving to the next hub. */
export function spreadDelay(intervalMs: number, random?: () => number): number;

// ---------------------------------------------------------------- link

export const SUBPROTOCOL: 'agentmesh.v1';
export const DEFAULT_HUB_URL: 'ws://127.0.0.1:7700/ws';
export const ENVELOPE_VERSION: '1.0';
export const DEFAULT_PING_INTERVAL_MS: 5000;
export const DEFAULT_DIAL_TIMEOUT_MS: 10000;
export const SDK_VERSION: string;

/** "host:port", "http://host:port", "ws://host:port" → "ws://host:port/ws" (https → wss); an explicit path is kept. */
export function wsURL(hub: string): string;
/** A new UUIDv7. */
export function newID(): string;

/** Request headers (the mesh's envelope headers; more members pass through). */
export interface Headers {
  /** Milliseconds left for the call. */
  ttl?: number;
  traceparent?: string;
  tracestate?: string;
  baggage?: string;
  correlationId?: string;
  retryCount?: number;
  idempotencyKey?: string;
  [key: string]: unknown;
}

/** A native "req" frame. */
export interface RequestFrame {
  type: 'req';
  seq: number;
  id?: string;
  method: string;
  params?: unknown;
  headers?: Headers;
  origin?: string;
  timestamp?: number;
  version?: string;
  stream?: number;
  [key: string]: unknown;
}

export interface CallOptions {
  /** The call's timeout (ms), sent as headers.ttl; the client's default when absent (0: none). */
  timeoutMs?: number;
  /** Aborting it cancels the call (a cancel frame is sent) with CANCELLED. */
  signal?: AbortSignal;
  /** The caller's W3C trace context. */
  traceparent?: string;
  tracestate?: string;
  /** More request headers. */
  headers?: Headers;
  /** The request id (default: a new UUID). */
  id?: string;
}

export interface LinkOptions {
  token?: string;
  signal?: AbortSignal;
  dialTimeoutMs?: number;
  /** WebSocket ping interval (ms, default 5000; 0: none); the hub is gone after 2 unanswered. */
  pingIntervalMs?: number;
  logger?: Logger;
  /** Serves the hub's requests; signal fires on cancel, ttl, or the link's loss. */
  onRequest?: (frame: RequestFrame, signal: AbortSignal, link: Link) => unknown;
  onGoAway?: (link: Link) => void;
  onClose?: (link: Link, error: MeshError) => void;
}

/** One WebSocket to a hub, multiplexing calls in both directions by seq. */
export class Link {
  /** Dials hub's /ws with the agentmesh.v1 subprotocol (and the bearer token). */
  static dial(hub: string, opts?: LinkOptions): Promise<Link>;
  readonly url: string;
  readonly pendingCount: number;
  readonly servingCount: number;
  lateResponses: number;
  goingAway: boolean;
  closing: boolean;
  isClosed: boolean;
  closeError: MeshError | null;
  /** Resolves once the link closed; never rejects. */
  readonly closed: Promise<{ code: number; reason: string; error: MeshError }>;
  call<T = unknown>(method: string, params?: unknown, opts?: CallOptions & { budgetMs?: number }): Promise<T>;
  /** Resolves true once nothing is served or awaited on the link (or it closed); false after timeoutMs. */
  whenIdle(timeoutMs?: number): Promise<boolean>;
  /** Closes with code (1000) after writing what is queued. */
  close(code?: number, reason?: string): Promise<{ code: number; reason: string; error: MeshError }>;
  terminate(): Promise<{ code: number; reason: string; error: MeshError }>;
}

// ---------------------------------------------------------------- client

export const DEFAULT_CALL_TIMEOUT_MS: 30000;

/** Hub URLs of an option (a string, a comma-separated list or an array), normalised; none: the default hub. */
export function hubList(hubs?: string | string[] | null): string[];

export interface ClientOptions {
  /** Hub URLs, tried in turn (default ws://127.0.0.1:7700/ws). */
  hubs?: string | string[];
  /** Bearer token (hubs run with --auth-key). */
  token?: string;
  /** Default call timeout (ms, 30000; 0: none). */
  timeoutMs?: number;
  dialTimeoutMs?: number;
  pingIntervalMs?: number;
  logger?: Logger;
}

/** Calls methods through a hub over one WebSocket, dialled on the first call. */
export class Client {
  constructor(opts?: ClientOptions);
  readonly hubs: string[];
  /** The hub the client is linked to now, or null. */
  readonly hub: string | null;
  /**
   * Calls method; rejects with a MeshError: the hub's or the agent's, TIMEOUT,
   * CANCELLED, UNAVAILABLE (link lost; notSent when it provably was not sent).
   */
  call<T = unknown>(method: string, params?: unknown, opts?: CallOptions): Promise<T>;
  /** Closes the client's links; later calls fail at once. */
  close(): Promise<void>;
}

// ---------------------------------------------------------------- agent

export const DEFAULT_DRAIN_TIMEOUT_MS: 5000;

/** null when c is a valid method name or "prefix.*" pattern, else why not. */
export function validCapability(c: string): string | null;

/** What a handler is given beside its params. */
export interface HandlerContext {
  /**
   * Fires when the caller cancels, when headers.ttl ms passed since the
   * request arrived, or when the link is lost; its reason is a MeshError
   * CANCELLED, TIMEOUT or UNAVAILABLE.
   */
  signal: AbortSignal;
  method: string;
  /** The request's id ('' when it had none). */
  requestId: string;
  headers: Headers;
  /** The caller's W3C trace context ('' when absent). */
  traceparent: string;
  tracestate: string;
  baggage: string;
  /** The caller's id, as the hub tells it ('' when absent). */
  origin: string;
  agent: Agent;
}

export type Handler<P = any, R = unknown> = (params: P, ctx: HandlerContext) => R | Promise<R>;

export interface AgentOptions {
  /** The agent's logical name. */
  name: string;
  /** Hub URLs, tried in turn (default ws://127.0.0.1:7700/ws). */
  hubs?: string | string[];
  token?: string;
  /** The agent id proposed to the hub (default: a new UUIDv7), kept across reconnects. */
  id?: string;
  /** How long shutdown waits for handlers in flight (ms, 5000). */
  drainTimeoutMs?: number;
  logger?: Logger;
  /** More metadata for agent.register (beside sdk, version, hostname, pid). */
  metadata?: Record<string, unknown>;
  pingIntervalMs?: number;
  dialTimeoutMs?: number;
}

export interface Registration {
  agentId: string;
  hub: string;
  heartbeatIntervalMs: number;
  /** "link" when the hub takes the link as the heartbeat. */
  liveness: 'link' | null;
}

export interface AgentEvents {
  registered: [Registration];
  disconnected: [{ hub: string; error: unknown; delayMs: number }];
  goaway: [{ hub: string }];
}

/**
 * Serves methods on the mesh: connects, registers, heartbeats, reconnects,
 * follows goaway, and on stop deregisters and drains.
 */
export class Agent extends EventEmitter {
  constructor(opts: AgentOptions);
  readonly name: string;
  readonly hubs: string[];
  /** The agent's id (the hub's, once registered). */
  readonly id: string;
  readonly inflight: number;
  readonly isRegistered: boolean;
  /** Resolves once registered (at once if it is); rejects if run() ends first. */
  readonly registered: Promise<Registration>;
  drainTimeoutMs: number;
  heartbeatIntervalMs: number;
  liveness: 'link' | null;
  /** Serves a method name or a "prefix.*" pattern. */
  handle<P = any, R = unknown>(method: string, fn: Handler<P, R>): this;
  /** The methods and patterns served, sorted. */
  methods(): string[];
  /** Runs until stop() or signal; rejects only when the hub refuses the credentials. */
  run(opts?: { signal?: AbortSignal }): Promise<void>;
  /** Deregisters, drains, closes; resolves once run() returned. */
  stop(): Promise<void>;
  /** Stops on the first of signals (SIGTERM, SIGINT); returns a function removing the handlers. */
  installSignalHandlers(signals?: NodeJS.Signals[]): () => void;
  /** run() that stops on SIGTERM or SIGINT. */
  runUntilSignal(opts?: { signal?: AbortSignal; signals?: NodeJS.Signals[] }): Promise<void>;

  on<K extends keyof AgentEvents>(event: K, listener: (...args: AgentEvents[K]) => void): this;
  once<K extends keyof AgentEvents>(event: K, listener: (...args: AgentEvents[K]) => void): this;
  off<K extends keyof AgentEvents>(event: K, listener: (...args: AgentEvents[K]) => void): this;
  emit<K extends keyof AgentEvents>(event: K, ...args: AgentEvents[K]): boolean;
}
