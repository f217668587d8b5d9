// Client: calls methods through a hub (PROTOCOL.md, "A client's life").

import { CANCELLED, MeshError, PERMISSION_DENIED, TIMEOUT, UNAUTHENTICATED, UNAVAILABLE } from './errors.js';
import { DEFAULT_HUB_URL, Link, silentLogger, wsURL } from './link.js';

/** A call's timeout unless told otherwise (ms), as the hub's default. */
export const DEFAULT_CALL_TIMEOUT_MS = 30000;

/** The hub URLs of an option: a string, a comma-separated list, or an array; none: the default hub. */
export function hubList(hubs) {
  let list;
  if (hubs === undefined || hubs === null) list = [];
  else if (typeof hubs === 'string') list = hubs.split(',');
  else if (Array.isArray(hubs)) list = hubs.flatMap((h) => String(h).split(','));
  else throw new TypeError('hubs must be a string or an array of strings');
  list = list.map((h) => h.trim()).filter((h) => h !== '');
  if (list.length === 0) list = [DEFAULT_HUB_URL];
  return list.map((h) => wsURL(h));
}

/**
 * Client calls methods on the mesh over one WebSocket to a hub, dialled on
 * the first call. After the link is lost (or the hub sent goaway) the next
 * call dials the next hub of the list.
 */
export class Client {
  /**
   * @param {object} [opts]
   * @param {string|string[]} [opts.hubs] hub URLs (default ws://127.0.0.1:7700/ws)
   * @param {string} [opts.token] bearer token
   * @param {number} [opts.timeoutMs] default timeout of a call (30000; 0: none)
   * @param {number} [opts.dialTimeoutMs] bound of one dial (10000)
   * @param {number} [opts.pingIntervalMs] link ping interval (5000)
   * @param {object} [opts.logger]
   */
  constructor(opts = {}) {
    this.hubs = hubList(opts.hubs);
    this._token = opts.token || undefined;
    this._timeoutMs = opts.timeoutMs ?? DEFAULT_CALL_TIMEOUT_MS;
    this._dialTimeoutMs = opts.dialTimeoutMs;
    this._pingIntervalMs = opts.pingIntervalMs;
    this.log = opts.logger ?? silentLogger;
    this._link = null; // the link new calls go on
    this._dialing = null; // the dial in progress, shared by the calls waiting for it
    this._next = 0; // index of the hub to dial next
    this._links = new Set(); // open links: the current one, and those draining after a goaway
    this._closed = false;
  }

  /** The URL of the hub the client is linked to (null when it has no link). */
  get hub() {
    return this._link?.url ?? null;
  }

  /**
   * Calls method with params; resolves with the result, or rejects with a
   * MeshError (the hub's or the agent's error, TIMEOUT, CANCELLED,
   * UNAVAILABLE).
   *
   * @param {string} method
   * @param {unknown} [params]
   * @param {{timeoutMs?: number, signal?: AbortSignal, traceparent?: string, tracestate?: string, headers?: object, id?: string}} [opts]
   */
  async call(method, params, opts = {}) {
    if (typeof method !== 'string' || method === '') throw new TypeError('method must be a non-empty string');
    if (this._closed) throw new MeshError(UNAVAILABLE, `${method}: the client is closed`, { notSent: true });
    const { signal } = opts;
    if (signal?.aborted) throw new MeshError(CANCELLED, `${method}: cancelled before it was sent`, { notSent: true, cause: signal.reason });
    const timeoutMs = opts.timeoutMs ?? this._timeoutMs;
    const deadline = timeoutMs > 0 ? Date.now() + timeoutMs : Infinity;
    let link = this._usable();
    if (link === null) link = await this._waitLink(deadline, signal, method, timeoutMs);
    const left = deadline - Date.now();
    if (left <= 0) throw new MeshError(TIMEOUT, `${method}: no answer within ${timeoutMs} ms`, { notSent: true });
    return link.call(method, params, { ...opts, timeoutMs: Number.isFinite(left) ? left : undefined, budgetMs: timeoutMs });
  }

  /**
   * Closes the client: its links close (calls awaiting answers fail with
   * UNAVAILABLE); later calls fail at once. Resolves once the links closed.
   */
  async close() {
    this._closed = true;
    this._link = null;
    if (this._dialing !== null) await this._dialing.catch(() => {});
    await Promise.all([...this._links].map((l) => l.close(1000)));
  }

  _usable() {
    const l = this._link;
    return l !== null && !l.closing && !l.goingAway ? l : null;
  }

  // Waits for a link (the dial in progress, or a new one) within the
  // call's deadline and signal.
  _waitLink(deadline, signal, method, timeoutMs) {
    if (this._dialing === null) this._dialing = this._dial();
    const dialing = this._dialing;
    return new Promise((resolve, reject) => {
      let timer = null;
      const onAbort = () => {
        cleanup();
        reject(new MeshError(CANCELLED, `${method}: cancelled before it was sent`, { notSent: true, cause: signal.reason }));
      };
      const cleanup = () => {
        if (timer !== null) clearTimeout(timer);
        signal?.removeEventListener('abort', onAbort);
      };
      if (Number.isFinite(deadline)) {
        timer = setTimeout(() => {
          cleanup();
          reject(new MeshError(TIMEOUT, `${method}: no link to a hub within ${timeoutMs} ms`, { notSent: true }));
        }, Math.max(0, deadline - Date.now()));
      }
      signal?.addEventListener('abort', onAbort, { once: true });
      dialing.then(
        (l) => {
          cleanup();
          resolve(l);
        },
        (e) => {
          cleanup();
          reject(e);
        },
      );
    });
  }

  // Dials the hubs in turn from the next one, each once; the first that
  // answers is the link.
  async _dial() {
    try {
      let last;
      for (let k = 0; k < this.hubs.length; k++) {
        const i = this._next % this.hubs.length;
        const url = this.hubs[i];
        try {
          const link = await Link.dial(url, {
            token: this._token,
            dialTimeoutMs: this._dialTimeoutMs,
            pingIntervalMs: this._pingIntervalMs,
            logger: this.log,
            onGoAway: (l) => this._goaway(l, i),
            onClose: (l) => this._lost(l, i),
          });
          if (this._closed) {
            await link.close(1000);
            throw new MeshError(UNAVAILABLE, 'the client is closed', { notSent: true });
          }
          this._links.add(link);
          this._link = link;
          this.log.debug('linked to hub', { hub: url });
          return link;
        } catch (e) {
          last = e;
          if (this._closed) throw e;
          if (e instanceof MeshError && (e.code === UNAUTHENTICATED || e.code === PERMISSION_DENIED)) throw e;
          this.log.debug('dial failed', { hub: url, error: e.message });
          this._next = i + 1;
        }
      }
      throw last;
    } finally {
      this._dialing = null;
    }
  }

  // The link was lost: the next call dials the next hub.
  _lost(l, i) {
    this._links.delete(l);
    if (this._link === l) {
      this._link = null;
      this._next = i + 1;
      this.log.debug('link to hub lost', { hub: l.url, error: l.closeError?.message });
    }
  }

  // The hub is draining: new calls go to the next hub; this link closes
  // once the calls on it are answered.
  _goaway(l, i) {
    if (this._link === l) {
      this._link = null;
      this._next = i + 1;
    }
    l.whenIdle().then(() => l.close(1000));
  }
}
