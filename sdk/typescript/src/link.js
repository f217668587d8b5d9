// One WebSocket to a hub speaking agentmesh.v1 (sdk/PROTOCOL.md): many
// calls multiplexed over it, paired by a link-scoped seq, in both
// directions. The Client and the Agent are built on it.

import { randomBytes, randomUUID } from 'node:crypto';
import WebSocket from 'ws';

import { CANCELLED, INTERNAL_ERROR, INVALID_PARAMS, INVALID_REQUEST, METHOD_NOT_FOUND, MeshError, PERMISSION_DENIED, TIMEOUT, UNAUTHENTICATED, UNAVAILABLE } from './errors.js';

/** The WebSocket subprotocol of the native frames. */
export const SUBPROTOCOL = 'agentmesh.v1';
/** The hub a client or agent uses unless told otherwise. */
export const DEFAULT_HUB_URL = 'ws://127.0.0.1:7700/ws';
/** The envelope version sent in requests. */
export const ENVELOPE_VERSION = '1.0';
/** How often a link pings the hub (ms); a hub silent for 2 pings is gone. */
export const DEFAULT_PING_INTERVAL_MS = 5000;
/** How long a dial may take (ms). */
export const DEFAULT_DIAL_TIMEOUT_MS = 10000;

// A batch (a JSON array of frames, one WebSocket message) carries at most
// this many frames and this many characters (under half of the hub's
// 1-MiB message limit even when every character takes 2 bytes), as the
// Go link batches its writes.
const MAX_BATCH_FRAMES = 128;
const MAX_BATCH_CHARS = 256 * 1024;
// How long close() waits for the hub's close frame before it drops the
// socket.
const CLOSE_WAIT_MS = 2000;

/** A logger that drops everything (the default). */
export const silentLogger = Object.freeze({ debug() {}, info() {}, warn() {}, error() {} });

/**
 * Normalises a hub address for a WebSocket link, as the Go SDK does:
 * "host:port", "http://host:port" and "ws://host:port" all become
 * "ws://host:port/ws" (https becomes wss); an explicit path is kept.
 */
export function wsURL(hub) {
  if (typeof hub !== 'string' || hub === '') throw new TypeError('hub URL must be a non-empty string');
  let s = hub;
  if (!s.includes('://')) s = 'ws://' + s;
  let u;
  try {
    u = new URL(s);
  } catch {
    throw new TypeError(`bad hub URL "${hub}"`);
  }
  switch (u.protocol) {
    case 'ws:':
    case 'wss:':
      break;
    case 'http:':
      u.protocol = 'ws:';
      break;
    case 'https:':
      u.protocol = 'wss:';
      break;
    default:
      throw new TypeError(`hub URL "${hub}": scheme must be ws, wss, http or https`);
  }
  if (!u.host) throw new TypeError(`hub URL "${hub}" has no host`);
  if (u.pathname === '' || u.pathname === '/' || u.pathname === '/rpc') u.pathname = '/ws';
  return u.toString();
}

/** A new UUIDv7 (time-ordered), as the Go SDK's agent ids. */
export function newID() {
  const b = randomBytes(16);
  b.writeUIntBE(Date.now(), 0, 6);
  b[6] = (b[6] & 0x0f) | 0x70;
  b[8] = (b[8] & 0x3f) | 0x80;
  const h = b.toString('hex');
  return `${h.slice(0, 8)}-${h.slice(8, 12)}-${h.slice(12, 16)}-${h.slice(16, 20)}-${h.slice(20)}`;
}

function isSeq(v) {
  return Number.isSafeInteger(v) && v > 0;
}

function unavailableNotSent(msg) {
  return new MeshError(UNAVAILABLE, msg, { notSent: true });
}

/**
 * Link is one open WebSocket to a hub. Use Link.dial to open one.
 *
 * Options (all optional):
 * - onRequest(frame, signal, link) → result or a promise of it: serves the
 *   hub's "req" frames (absent: they are answered METHOD_NOT_FOUND); a
 *   throw is answered with MeshError.from(err)'s code. signal fires on a
 *   cancel frame, when the request's ttl passed, or when the link is lost.
 * - onGoAway(link): the hub sent goaway (it takes no new calls here).
 * - onClose(link, error): the link closed (error: a MeshError UNAVAILABLE).
 * - pingIntervalMs (5000; 0: no pings), logger.
 */
export class Link {
  /**
   * Dials a hub's /ws with the agentmesh.v1 subprotocol and a bearer token
   * (if any). It fails with a MeshError: UNAUTHENTICATED or
   * PERMISSION_DENIED when the hub refused the token (401, 403),
   * UNAVAILABLE (notSent) when the hub cannot be reached, is not a hub or
   * did not answer within dialTimeoutMs, CANCELLED when signal fired.
   */
  static dial(hub, opts = {}) {
    let url;
    try {
      url = wsURL(hub);
    } catch (e) {
      return Promise.reject(new MeshError(INVALID_REQUEST, e.message, { notSent: true }));
    }
    const { token, signal } = opts;
    const timeoutMs = opts.dialTimeoutMs ?? DEFAULT_DIAL_TIMEOUT_MS;
    if (signal?.aborted) return Promise.reject(new MeshError(CANCELLED, `dial ${url} cancelled`, { notSent: true }));
    return new Promise((resolve, reject) => {
      const headers = {};
      if (token) headers.Authorization = `Bearer ${token}`;
      let settled = false;
      let ws;
      try {
        ws = new WebSocket(url, [SUBPROTOCOL], {
          headers,
          perMessageDeflate: false,
          followRedirects: false,
          // ws's own handshakeTimeout would emit a generic error; ours
          // names the cause.
        });
      } catch (e) {
        reject(new MeshError(INVALID_REQUEST, `bad hub URL ${url}: ${e.message}`, { notSent: true }));
        return;
      }
      const onAbort = () => fail(new MeshError(CANCELLED, `dial ${url} cancelled`, { notSent: true }));
      const timer = setTimeout(() => fail(unavailableNotSent(`hub ${url} did not complete the WebSocket handshake within ${timeoutMs} ms`)), timeoutMs);
      signal?.addEventListener('abort', onAbort, { once: true });
      const done = () => {
        settled = true;
        clearTimeout(timer);
        signal?.removeEventListener('abort', onAbort);
      };
      function fail(err) {
        if (settled) return;
        done();
        // Later 'error' and 'close' events of this socket land in the
        // listeners below, which do nothing once settled.
        try {
          ws.terminate();
        } catch {
          // already closed
        }
        reject(err);
      }
      ws.on('unexpected-response', (req, res) => {
        const st = res.statusCode;
        const text = `hub ${url} refused the WebSocket: ${st} ${res.statusMessage ?? ''}`.trim();
        res.resume();
        if (st === 401) fail(new MeshError(UNAUTHENTICATED, text, { notSent: true }));
        else if (st === 403) fail(new MeshError(PERMISSION_DENIED, text, { notSent: true }));
        else fail(unavailableNotSent(text));
      });
      ws.on('error', (e) => fail(unavailableNotSent(`cannot reach hub ${url}: ${e.message}`)));
      ws.on('close', () => fail(unavailableNotSent(`hub ${url} closed the WebSocket before it opened`)));
      ws.once('open', () => {
        if (settled) return;
        if (ws.protocol !== SUBPROTOCOL) {
          fail(unavailableNotSent(`hub ${url} does not speak ${SUBPROTOCOL}`));
          return;
        }
        done();
        ws.removeAllListeners('error');
        ws.removeAllListeners('close');
        ws.removeAllListeners('unexpected-response');
        resolve(new Link(ws, url, opts));
      });
    });
  }

  /** Use Link.dial; this wraps an open ws WebSocket. */
  constructor(ws, url, opts = {}) {
    this.ws = ws;
    /** The hub's URL. */
    this.url = url;
    this.log = opts.logger ?? silentLogger;
    this._onRequest = opts.onRequest ?? null;
    this._onGoAway = opts.onGoAway ?? null;
    this._onClose = opts.onClose ?? null;
    this._seq = 0;
    this._pending = new Map(); // seq -> call awaiting its answer
    this._serving = new Map(); // seq -> AbortController of a request served
    this._out = []; // encoded frames waiting for the next flush
    this._flushing = null; // setImmediate handle
    this._lastSeen = Date.now(); // when the hub last sent anything (a message, a ping, a pong)
    this._deadError = null;
    this._closeTimer = null;
    this._idleWaiters = new Set();
    /** Answers that arrived for calls no longer waiting. */
    this.lateResponses = 0;
    /** The hub sent goaway: it takes no new calls on this link. */
    this.goingAway = false;
    /** close() was called or the link closed: no new calls. */
    this.closing = false;
    /** The link closed. */
    this.isClosed = false;
    /** Why the link closed (a MeshError UNAVAILABLE), once closed. */
    this.closeError = null;
    /** Resolves with {code, reason, error} once the link closed; never rejects. */
    this.closed = new Promise((resolve) => {
      this._resolveClosed = resolve;
    });
    ws.on('message', (data, isBinary) => this._onMessage(data, isBinary));
    ws.on('pong', () => {
      this._lastSeen = Date.now();
    });
    ws.on('ping', () => {
      this._lastSeen = Date.now(); // ws answers it by itself
    });
    ws.on('error', (e) => {
      this.log.debug('link error', { hub: this.url, error: e.message });
    });
    ws.on('close', (code, reason) => this._closedNow(code, reason.toString()));
    // Liveness: a ping every interval; a hub silent (no message, ping
    // or pong) for two intervals is gone.
    const ping = opts.pingIntervalMs ?? DEFAULT_PING_INTERVAL_MS;
    this._pingMs = ping;
    this._pingTimer = null;
    this._deadTimer = null;
    if (ping > 0) {
      this._pingTimer = setInterval(() => this._ping(), ping);
      this._deadTimer = setTimeout(() => this._checkAlive(), 2 * ping);
    }
  }

  /** Calls awaiting an answer on this link. */
  get pendingCount() {
    return this._pending.size;
  }

  /** Requests from the hub being served on this link. */
  get servingCount() {
    return this._serving.size;
  }

  /**
   * Sends a request and resolves with its result, or rejects with a
   * MeshError: the hub's error; TIMEOUT after timeoutMs (the hub is sent a
   * cancel); CANCELLED when signal fired (likewise); UNAVAILABLE when the
   * link was lost (notSent when it was closed before the call).
   *
   * opts: timeoutMs (sent as headers.ttl), signal, headers (more request
   * headers), traceparent, tracestate, id (the request id).
   */
  call(method, params, opts = {}) {
    if (this.closing) return Promise.reject(unavailableNotSent(`${method}: link to hub ${this.url} closed`));
    const { signal } = opts;
    if (signal?.aborted) return Promise.reject(new MeshError(CANCELLED, `${method}: cancelled before it was sent`, { notSent: true }));
    const timeoutMs = opts.timeoutMs;
    const headers = { ...(opts.headers ?? {}) };
    if (opts.traceparent) headers.traceparent = opts.traceparent;
    if (opts.tracestate) headers.tracestate = opts.tracestate;
    if (timeoutMs > 0) headers.ttl = Math.max(1, Math.ceil(timeoutMs));
    const seq = ++this._seq;
    const frame = { type: 'req', seq, id: opts.id ?? randomUUID(), method };
    if (params !== undefined) frame.params = params;
    if (Object.keys(headers).length > 0) frame.headers = headers;
    frame.timestamp = Date.now();
    frame.version = ENVELOPE_VERSION;
    let text;
    try {
      text = JSON.stringify(frame);
    } catch (e) {
      return Promise.reject(new MeshError(INVALID_PARAMS, `${method}: cannot encode params: ${e.message}`, { notSent: true }));
    }
    return new Promise((resolve, reject) => {
      let timer = null;
      let onAbort = null;
      const entry = {
        method,
        settle: (f) => {
          cleanup();
          if (f.error !== undefined && f.error !== null) reject(MeshError.fromWire(f.error));
          else resolve(f.result === undefined ? null : f.result);
        },
        fail: (err) => {
          cleanup();
          reject(err);
        },
      };
      const cleanup = () => {
        if (timer !== null) clearTimeout(timer);
        if (onAbort !== null) signal.removeEventListener('abort', onAbort);
      };
      const giveUp = (err) => {
        if (this._pending.get(seq) !== entry) return;
        this._pending.delete(seq);
        this._sendFrame(`{"type":"cancel","seq":${seq}}`);
        entry.fail(err);
        this._notifyIdle();
      };
      if (timeoutMs > 0) {
        const budget = opts.budgetMs ?? timeoutMs; // the call's whole timeout, for the message
        timer = setTimeout(() => giveUp(new MeshError(TIMEOUT, `${method}: no answer within ${Math.round(budget)} ms`)), timeoutMs);
      }
      if (signal) {
        onAbort = () => giveUp(new MeshError(CANCELLED, `${method}: cancelled by the caller`, { cause: signal.reason }));
        signal.addEventListener('abort', onAbort, { once: true });
      }
      this._pending.set(seq, entry);
      this._sendFrame(text);
    });
  }

  /**
   * Closes the link (close code 1000 by default) after writing what is
   * queued; resolves once it closed. Calls awaiting answers fail with
   * UNAVAILABLE; handlers still running see their signal fire.
   */
  close(code = 1000, reason = '') {
    if (this.isClosed) return this.closed;
    this.closing = true;
    if (this._closeTimer === null) {
      this._flush();
      try {
        this.ws.close(code, reason);
      } catch {
        this.ws.terminate();
      }
      this._closeTimer = setTimeout(() => this.ws.terminate(), CLOSE_WAIT_MS);
    }
    return this.closed;
  }

  /** Drops the socket at once. */
  terminate() {
    this.closing = true;
    this.ws.terminate();
    return this.closed;
  }

  // --- writing ---

  // Queues one encoded frame; frames queued in the same turn of the event
  // loop go out as one message (a batch) when there are several.
  _sendFrame(text) {
    if (this.isClosed) return false;
    this._out.push(text);
    if (this._flushing === null) this._flushing = setImmediate(() => this._flush());
    return true;
  }

  _flush() {
    if (this._flushing !== null) {
      clearImmediate(this._flushing);
      this._flushing = null;
    }
    const out = this._out;
    if (out.length === 0) return;
    this._out = [];
    if (this.isClosed || this.ws.readyState !== WebSocket.OPEN) return;
    let i = 0;
    while (i < out.length) {
      let n = out[i].length + 2;
      let j = i + 1;
      while (j < out.length && j - i < MAX_BATCH_FRAMES && n + out[j].length + 1 <= MAX_BATCH_CHARS) {
        n += out[j].length + 1;
        j++;
      }
      const msg = j - i === 1 ? out[i] : '[' + out.slice(i, j).join(',') + ']';
      this.ws.send(msg);
      i = j;
    }
  }

  // --- reading ---

  _onMessage(data, isBinary) {
    this._lastSeen = Date.now();
    const text = Array.isArray(data) ? Buffer.concat(data).toString('utf8') : Buffer.from(data).toString('utf8');
    let v;
    try {
      v = JSON.parse(text);
    } catch (e) {
      // No frame can be named to answer: close, so that calls fail at
      // once rather than wait for their timeout (as the Go link does).
      this.log.warn('closing the link: a message from the hub is not JSON', { hub: this.url, error: e.message, binary: isBinary });
      this.close(1007, 'invalid frame: not JSON');
      return;
    }
    if (Array.isArray(v)) {
      for (const f of v) this._onFrame(f);
    } else {
      this._onFrame(v);
    }
  }

  _onFrame(f) {
    if (f === null || typeof f !== 'object' || Array.isArray(f)) {
      this.log.warn('dropping a frame that is not an object', { hub: this.url });
      return;
    }
    switch (f.type) {
      case 'res':
      case 'end': {
        const e = this._pending.get(f.seq);
        if (e === undefined) {
          this.lateResponses++;
          return;
        }
        this._pending.delete(f.seq);
        e.settle(f);
        this._notifyIdle();
        return;
      }
      case 'req':
        this._onRequestFrame(f);
        return;
      case 'cancel': {
        const ac = this._serving.get(f.seq);
        if (ac !== undefined) ac.abort(new MeshError(CANCELLED, 'the caller cancelled the call'));
        return;
      }
      case 'goaway':
        if (!this.goingAway) {
          this.goingAway = true;
          this.log.debug('hub is draining (goaway)', { hub: this.url });
          this._onGoAway?.(this);
        }
        return;
      default:
        // chunk, credit and frames of later versions: not used here.
        return;
    }
  }

  _onRequestFrame(f) {
    const seq = f.seq;
    if (!isSeq(seq)) {
      this.log.warn('dropping a request without a valid seq', { hub: this.url, method: f.method });
      return;
    }
    if (this._serving.has(seq)) {
      this.log.warn('dropping a request whose seq is being served', { hub: this.url, seq });
      return;
    }
    if (typeof f.method !== 'string' || f.method === '') {
      this._answer(seq, f.id, undefined, new MeshError(INVALID_REQUEST, 'request has no method'));
      return;
    }
    if (this._onRequest === null) {
      this._answer(seq, f.id, undefined, new MeshError(METHOD_NOT_FOUND, 'this peer serves no methods'));
      return;
    }
    const ac = new AbortController();
    this._serving.set(seq, ac);
    let ttlTimer = null;
    const ttl = f.headers?.ttl;
    if (typeof ttl === 'number' && ttl > 0) {
      ttlTimer = setTimeout(() => ac.abort(new MeshError(TIMEOUT, `the call's ttl of ${ttl} ms passed`)), ttl);
    }
    let p;
    try {
      p = Promise.resolve(this._onRequest(f, ac.signal, this));
    } catch (e) {
      p = Promise.reject(e);
    }
    p.then(
      (result) => {
        if (ttlTimer !== null) clearTimeout(ttlTimer);
        this._answer(seq, f.id, result, undefined);
      },
      (err) => {
        if (ttlTimer !== null) clearTimeout(ttlTimer);
        this._answer(seq, f.id, undefined, err);
      },
    );
  }

  // Queues the answer to the served request seq (dropped if the link is
  // closed), then forgets it: servingCount 0 means every answer is queued.
  _answer(seq, id, result, err) {
    let text;
    if (err === undefined) {
      try {
        text = JSON.stringify({ type: 'res', seq, id, result: result === undefined ? null : result });
      } catch (e) {
        err = new MeshError(INTERNAL_ERROR, `cannot encode the result: ${e.message}`);
      }
    }
    if (err !== undefined) {
      const me = MeshError.from(err);
      try {
        text = JSON.stringify({ type: 'res', seq, id, error: me.toWire() });
      } catch {
        // details that do not encode
        text = JSON.stringify({ type: 'res', seq, id, error: { ...me.toWire(), details: undefined } });
      }
    }
    this._sendFrame(text);
    this._serving.delete(seq);
    this._notifyIdle();
  }

  /**
   * Resolves true once the link serves nothing and awaits no answer (or
   * closed), false after timeoutMs (if given) if not.
   */
  whenIdle(timeoutMs) {
    return new Promise((resolve) => {
      const w = {
        check: () => this.isClosed || (this._serving.size === 0 && this._pending.size === 0),
        done: (v) => {
          if (t !== null) clearTimeout(t);
          this._idleWaiters.delete(w);
          resolve(v);
        },
      };
      if (w.check()) {
        resolve(true);
        return;
      }
      const t = timeoutMs !== undefined && timeoutMs !== null ? setTimeout(() => w.done(false), Math.max(0, timeoutMs)) : null;
      this._idleWaiters.add(w);
    });
  }

  _notifyIdle() {
    if (this._idleWaiters.size === 0) return;
    for (const w of [...this._idleWaiters]) if (w.check()) w.done(true);
  }

  // --- liveness and loss ---

  _ping() {
    if (this.isClosed) return;
    try {
      this.ws.ping();
    } catch {
      // closing
    }
  }

  _checkAlive() {
    this._deadTimer = null;
    if (this.isClosed) return;
    const silent = Date.now() - this._lastSeen;
    const limit = 2 * this._pingMs;
    if (silent < limit) {
      this._deadTimer = setTimeout(() => this._checkAlive(), limit - silent);
      return;
    }
    this._deadError = new MeshError(UNAVAILABLE, `hub ${this.url} silent for ${silent} ms: no pong to 2 pings`);
    this.log.warn('hub link dead: silent for two ping intervals', { hub: this.url, silentMs: silent });
    this.ws.terminate();
  }

  _closedNow(code, reason) {
    if (this.isClosed) return;
    this.isClosed = true;
    this.closing = true;
    if (this._pingTimer !== null) clearInterval(this._pingTimer);
    if (this._deadTimer !== null) clearTimeout(this._deadTimer);
    if (this._flushing !== null) clearImmediate(this._flushing);
    this._flushing = null;
    this._out = [];
    if (this._closeTimer !== null) clearTimeout(this._closeTimer);
    const why = this._deadError?.message ?? `link to hub ${this.url} lost (close ${code}${reason ? ': ' + reason : ''})`;
    const error = this._deadError ?? new MeshError(UNAVAILABLE, why);
    this.closeError = error;
    const pending = [...this._pending.values()];
    this._pending.clear();
    for (const e of pending) e.fail(new MeshError(UNAVAILABLE, `${e.method}: ${why}`));
    for (const ac of this._serving.values()) ac.abort(new MeshError(UNAVAILABLE, why));
    this._resolveClosed({ code, reason, error });
    this._notifyIdle();
    try {
      this._onClose?.(this, error);
    } catch (e) {
      this.log.error('onClose hook threw', { error: String(e) });
    }
  }
}
