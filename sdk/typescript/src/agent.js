// Agent: serves methods on the mesh (PROTOCOL.md, "An agent's life"), as
// the Go SDK's agents.Agent does.

import { EventEmitter } from 'node:events';
import { hostname } from 'node:os';

import { Redial, spreadDelay } from './backoff.js';
import { hubList } from './client.js';
import { AGENT_NOT_FOUND, INVALID_REQUEST, METHOD_NOT_FOUND, MeshError, PERMISSION_DENIED, RPC_ERROR, UNAUTHENTICATED, UNAVAILABLE } from './errors.js';
import { Link, newID, silentLogger } from './link.js';
import { SDK_VERSION } from './version.js';

/** How long an agent waits for its handlers in flight on shutdown (ms). */
export const DEFAULT_DRAIN_TIMEOUT_MS = 5000;
/** The heartbeat interval when the hub assigns none (ms). */
const DEFAULT_HEARTBEAT_MS = 5000;
/** Bound of agent.register (ms). */
const REGISTER_TIMEOUT_MS = 10000;
/** Bound of agent.deregister (ms). */
const DEREGISTER_TIMEOUT_MS = 2000;

/**
 * Checks a method name or pattern as the hub does: 1 to 256 bytes,
 * printable without spaces, "*" only as a whole last segment ("ts.*").
 */
export function validCapability(c) {
  if (typeof c !== 'string' || c === '' || Buffer.byteLength(c) > 256) return 'capability must be 1 to 256 bytes';
  for (let i = 0; i < c.length; i++) {
    const ch = c.charCodeAt(i);
    if (ch <= 0x20 || ch === 0x7f) return `capability "${c}" contains a space or control character`;
  }
  const i = c.indexOf('*');
  if (i >= 0 && (i !== c.length - 1 || (i > 0 && c[i - 1] !== '.'))) return `capability "${c}": "*" may only end a pattern, as in "memory.*"`;
  return null;
}

function sleep(ms, signal) {
  return new Promise((resolve) => {
    if (signal.aborted) {
      resolve();
      return;
    }
    const done = () => {
      clearTimeout(t);
      signal.removeEventListener('abort', done);
      resolve();
    };
    const t = setTimeout(done, ms);
    signal.addEventListener('abort', done, { once: true });
  });
}

function isAbortError(e, signal) {
  return e === signal.reason || (e instanceof Error && e.name === 'AbortError');
}

/**
 * Agent serves methods on the mesh. Register handlers with handle(), then
 * run(): it connects to the hubs (tried in turn), registers, heartbeats,
 * serves, reconnects after a lost link, follows a hub's goaway, and on
 * stop() (or its signal) deregisters, drains and resolves.
 *
 * Events: 'registered' ({agentId, hub, heartbeatIntervalMs, liveness}),
 * 'disconnected' ({hub, error, delayMs}), 'goaway' ({hub}).
 */
export class Agent extends EventEmitter {
  /**
   * @param {object} opts
   * @param {string} opts.name the agent's logical name
   * @param {string|string[]} [opts.hubs] hub URLs (default ws://127.0.0.1:7700/ws)
   * @param {string} [opts.token] bearer token
   * @param {string} [opts.id] agent id (default: a new UUIDv7), kept across reconnects
   * @param {number} [opts.drainTimeoutMs] bound of the drain on shutdown (5000)
   * @param {object} [opts.logger] {debug, info, warn, error}(message, fields)
   * @param {object} [opts.metadata] more metadata sent with agent.register
   * @param {number} [opts.pingIntervalMs] link ping interval (5000)
   * @param {number} [opts.dialTimeoutMs] bound of one dial (10000)
   */
  constructor(opts = {}) {
    super();
    if (typeof opts.name !== 'string' || opts.name === '') throw new TypeError('Agent: name is required');
    this.name = opts.name;
    this.hubs = hubList(opts.hubs);
    this._token = opts.token || undefined;
    this._proposedId = opts.id || newID();
    this._assignedId = null;
    this.drainTimeoutMs = opts.drainTimeoutMs ?? DEFAULT_DRAIN_TIMEOUT_MS;
    this.log = opts.logger ?? silentLogger;
    this._metadata = opts.metadata ?? {};
    this._pingIntervalMs = opts.pingIntervalMs;
    this._dialTimeoutMs = opts.dialTimeoutMs;
    this._random = opts.random ?? Math.random; // tests pin the jitter
    this._exact = new Map();
    this._patterns = []; // {prefix, fn}, longest prefix first
    this._inflight = 0;
    this._idleWaiters = new Set();
    this._links = new Set();
    this._drains = new Set();
    this._stopCtl = null;
    this._running = null;
    this._reg = null; // {agentId, hub, heartbeatIntervalMs, liveness} while registered
    this._regWait = null;
    /** The heartbeat interval the last hub assigned (ms); 0 before. */
    this.heartbeatIntervalMs = 0;
    /** "link" when the hub takes the link as the heartbeat. */
    this.liveness = null;
    this._serveBound = (frame, signal, link) => this._serve(frame, signal, link);
  }

  /** The agent's id: the one the hub assigned, once registered. */
  get id() {
    return this._assignedId ?? this._proposedId;
  }

  /** Handlers running now. */
  get inflight() {
    return this._inflight;
  }

  /** Whether the agent is registered with a hub now. */
  get isRegistered() {
    return this._reg !== null;
  }

  /**
   * A promise that resolves with {agentId, hub, heartbeatIntervalMs,
   * liveness} once the agent is registered (at once if it is), or rejects
   * if run() ends first.
   */
  get registered() {
    if (this._reg !== null) return Promise.resolve(this._reg);
    if (this._regWait === null) {
      let resolve, reject;
      const promise = new Promise((res, rej) => {
        resolve = res;
        reject = rej;
      });
      promise.catch(() => {}); // rejected only for those who wait
      this._regWait = { promise, resolve, reject };
    }
    return this._regWait.promise;
  }

  /**
   * Registers fn for a method name or a "prefix.*" pattern. fn(params, ctx)
   * returns the result (or a promise of it); a thrown MeshError is sent
   * with its code, anything else thrown as INTERNAL_ERROR with its message.
   */
  handle(method, fn) {
    const bad = validCapability(method);
    if (bad !== null) throw new TypeError(`Agent.handle: ${bad}`);
    if (typeof fn !== 'function') throw new TypeError('Agent.handle: the handler must be a function');
    if (method.endsWith('*')) {
      const prefix = method.slice(0, -1);
      this._patterns = this._patterns.filter((p) => p.prefix !== prefix);
      this._patterns.push({ prefix, fn });
      this._patterns.sort((a, b) => b.prefix.length - a.prefix.length);
    } else {
      this._exact.set(method, fn);
    }
    return this;
  }

  /** The methods and patterns served, sorted (the capabilities registered). */
  methods() {
    return [...this._exact.keys(), ...this._patterns.map((p) => p.prefix + '*')].sort();
  }

  _handler(method) {
    const fn = this._exact.get(method);
    if (fn !== undefined) return fn;
    for (const p of this._patterns) if (method.startsWith(p.prefix)) return p.fn;
    return null;
  }

  /**
   * Runs the agent until stop() or signal: resolves once it deregistered,
   * drained its handlers (at most drainTimeoutMs) and closed its links.
   * Rejects when the hub refuses the agent's credentials
   * (UNAUTHENTICATED, PERMISSION_DENIED): trying again cannot succeed.
   */
  run(opts = {}) {
    if (this._running !== null) return Promise.reject(new Error('Agent.run: already running'));
    if (this._exact.size === 0 && this._patterns.length === 0) return Promise.reject(new Error('Agent.run: no handlers registered'));
    const ctl = new AbortController();
    this._stopCtl = ctl;
    const { signal } = opts;
    const onSignal = () => ctl.abort();
    if (signal?.aborted) ctl.abort();
    signal?.addEventListener('abort', onSignal, { once: true });
    const running = this._loop(ctl.signal).finally(() => {
      signal?.removeEventListener('abort', onSignal);
      this._stopCtl = null;
      this._running = null;
      if (this._regWait !== null) {
        this._regWait.reject(new MeshError(UNAVAILABLE, 'the agent stopped before it registered'));
        this._regWait = null;
      }
    });
    this._running = running;
    return running;
  }

  /** Stops run(): resolves once it returned. */
  stop() {
    if (this._running === null) return Promise.resolve();
    const running = this._running;
    this._stopCtl?.abort();
    return running.then(
      () => {},
      () => {},
    );
  }

  /**
   * Stops the agent on the first of signals (SIGTERM and SIGINT by
   * default); returns a function that removes the handlers.
   */
  installSignalHandlers(signals = ['SIGTERM', 'SIGINT']) {
    const on = (sig) => {
      this.log.info('signal received; shutting down', { signal: sig });
      this.stop();
    };
    for (const s of signals) process.on(s, on);
    return () => {
      for (const s of signals) process.off(s, on);
    };
  }

  /** run() that stops on SIGTERM or SIGINT (or opts.signals). */
  async runUntilSignal(opts = {}) {
    const { signals, ...runOpts } = opts;
    const uninstall = this.installSignalHandlers(signals);
    try {
      await this.run(runOpts);
    } finally {
      uninstall();
    }
  }

  // --- the run loop ---

  async _loop(stop) {
    const bo = new Redial(this._random);
    let prev = null; // the link of a hub that sent goaway, until registered elsewhere
    try {
      for (let i = 0; ; i++) {
        const hub = this.hubs[i % this.hubs.length];
        const out = await this._session(hub, prev, stop);
        if (out.registered) {
          prev = null; // the session retired it
          bo.reset();
        }
        if (stop.aborted) return;
        if (out.next) {
          // The hub is draining: register on the next hub at once; the
          // old link is retired once that succeeded.
          this.log.info('hub is draining (goaway); moving to the next hub', { hub });
          this.emit('goaway', { hub });
          if (prev !== null) await this._retire(prev);
          prev = out.next;
          continue;
        }
        const err = out.error;
        if (err instanceof MeshError && (err.code === UNAUTHENTICATED || err.code === PERMISSION_DENIED)) {
          this.log.error('the hub refused this agent\'s credentials', { hub, error: err.message });
          throw err;
        }
        let delayMs = bo.next();
        if (out.registered && this.hubs.length > 1) {
          // A registered link lost while other hubs are listed: move to
          // the next one, spread so that the agents of a lost hub do not
          // all arrive at once.
          delayMs = spreadDelay(this.heartbeatIntervalMs, this._random);
        }
        if (out.registered) this.log.warn('hub link lost; reconnecting', { hub, error: err?.message, inMs: Math.round(delayMs) });
        else this.log.warn('cannot register with the hub; trying again', { hub, error: err?.message, inMs: Math.round(delayMs) });
        this.emit('disconnected', { hub, error: err, delayMs });
        await sleep(delayMs, stop);
        if (stop.aborted) return;
      }
    } finally {
      if (prev !== null) await this._retire(prev);
      while (this._drains.size > 0) await Promise.all([...this._drains]);
      await Promise.all([...this._links].map((l) => l.close(1000)));
    }
  }

  // One link's life: dial, register, heartbeat, serve. Resolves with
  // {registered, next?, error?}: next is the link of a hub that sent
  // goaway, kept open (and heartbeated) for the requests it serves.
  async _session(hub, prev, stop) {
    this.log.debug('dialing hub', { hub, agent: this.id });
    let link;
    try {
      link = await Link.dial(hub, {
        token: this._token,
        signal: stop,
        dialTimeoutMs: this._dialTimeoutMs,
        pingIntervalMs: this._pingIntervalMs,
        logger: this.log,
        onRequest: this._serveBound,
      });
    } catch (e) {
      return { registered: false, error: e };
    }
    this._links.add(link);
    let keep = false;
    let registered = false;
    try {
      let reg;
      try {
        reg = await this._register(link, stop);
      } catch (e) {
        return { registered: false, error: e };
      }
      registered = true;
      this._setRegistered(hub, reg);
      if (prev !== null) await this._retire(prev);
      this.log.info('registered', { hub, agent: this.id, methods: this.methods(), heartbeatMs: reg.intervalMs, linkLiveness: reg.linkLiveness });
      this.emit('registered', this._reg);
      const out = await this._serveLink(link, reg, stop);
      switch (out.kind) {
        case 'stop':
          await this._shutdown(link);
          return { registered: true };
        case 'goaway':
          keep = true;
          return { registered: true, next: this._keep(link) };
        default:
          return { registered: true, error: out.error };
      }
    } finally {
      if (registered) this._setUnregistered();
      if (!keep) {
        await link.close(1000);
        this._links.delete(link);
      }
    }
  }

  // Serves link until it is lost, stop fires or the hub sends goaway,
  // heartbeating meanwhile unless the hub takes the link for it.
  _serveLink(link, reg, stop) {
    return new Promise((resolve) => {
      let { intervalMs, linkLiveness } = reg;
      let settled = false;
      let timer = null;
      let beating = false;
      const finish = (out) => {
        if (settled) return;
        settled = true;
        if (timer !== null) clearInterval(timer);
        stop.removeEventListener('abort', onStop);
        link._onGoAway = null;
        resolve(out);
      };
      const onStop = () => finish({ kind: 'stop' });
      const startBeats = () => {
        if (timer !== null) clearInterval(timer);
        timer = linkLiveness ? null : setInterval(beat, intervalMs);
      };
      const beat = async () => {
        if (beating || settled) return;
        beating = true;
        try {
          await this._heartbeat(link, intervalMs);
        } catch (e) {
          if (settled) return;
          if (e instanceof MeshError && e.code === AGENT_NOT_FOUND) {
            // The hub expired us (a pause longer than its TTL): register
            // again on the same link.
            this.log.warn('the hub expired this agent; registering again', { hub: link.url, error: e.message });
            try {
              const r = await this._register(link, stop);
              if (settled) return;
              ({ intervalMs, linkLiveness } = r);
              this._setRegistered(link.url, r);
              this.emit('registered', this._reg);
              startBeats();
            } catch (e2) {
              finish({ kind: 'error', error: e2 });
            }
          } else {
            this.log.warn('heartbeat failed', { hub: link.url, error: e.message });
          }
        } finally {
          beating = false;
        }
      };
      stop.addEventListener('abort', onStop, { once: true });
      link._onGoAway = () => finish({ kind: 'goaway' });
      link.closed.then(({ error }) => finish({ kind: 'closed', error }));
      startBeats();
      if (stop.aborted) onStop();
      else if (link.goingAway) finish({ kind: 'goaway' });
    });
  }

  async _register(link, stop) {
    const metadata = { sdk: 'typescript', version: SDK_VERSION, hostname: hostname(), pid: process.pid, ...this._metadata };
    const params = { agentId: this.id, name: this.name, capabilities: this.methods(), intents: ['serve'], metadata };
    const res = await link.call('agent.register', params, { timeoutMs: REGISTER_TIMEOUT_MS, signal: stop });
    if (res === null || typeof res !== 'object' || res.accepted !== true) {
      throw new MeshError(RPC_ERROR, 'the hub did not accept the registration');
    }
    if (typeof res.agentId === 'string' && res.agentId !== '') this._assignedId = res.agentId;
    let intervalMs = Number(res.heartbeatInterval) * 1000;
    if (!(intervalMs > 0)) intervalMs = DEFAULT_HEARTBEAT_MS;
    return { intervalMs, linkLiveness: res.liveness === 'link' };
  }

  _heartbeat(link, intervalMs) {
    const params = { agentId: this.id, status: { state: 'ready', queuedRequests: this._inflight, lastActivity: Date.now() } };
    return link.call('agent.heartbeat', params, { timeoutMs: intervalMs });
  }

  _setRegistered(hub, reg) {
    this.heartbeatIntervalMs = reg.intervalMs;
    this.liveness = reg.linkLiveness ? 'link' : null;
    this._reg = { agentId: this.id, hub, heartbeatIntervalMs: reg.intervalMs, liveness: this.liveness };
    if (this._regWait !== null) {
      this._regWait.resolve(this._reg);
      this._regWait = null;
    }
  }

  _setUnregistered() {
    this._reg = null;
  }

  // The link of a hub that sent goaway, kept while the agent registers
  // elsewhere: heartbeated (unless the hub takes the link for it), so that
  // the draining hub does not expire the agent and fail the requests it
  // still serves there.
  _keep(link) {
    const o = { link, timer: null };
    const iv = this.heartbeatIntervalMs || DEFAULT_HEARTBEAT_MS;
    if (this.liveness !== 'link') {
      o.timer = setInterval(() => {
        this._heartbeat(link, iv).catch(() => {});
      }, iv);
      link.closed.then(() => clearInterval(o.timer));
    }
    return o;
  }

  // Leaves the link of a draining hub: stops heartbeating there,
  // deregisters there (the registration moved to another hub: this only
  // drops the draining hub's binding) and closes the link once the
  // requests it serves are answered (at most drainTimeoutMs).
  async _retire(o) {
    if (o.timer !== null) clearInterval(o.timer);
    const l = o.link;
    try {
      await l.call('agent.deregister', { agentId: this.id, reason: 'hub draining' }, { timeoutMs: DEREGISTER_TIMEOUT_MS });
    } catch (e) {
      if (!l.isClosed) this.log.warn('deregister from the draining hub failed', { hub: l.url, error: e.message });
    }
    const d = (async () => {
      await l.whenIdle(this.drainTimeoutMs);
      await l.close(1000);
      this._links.delete(l);
    })();
    this._drains.add(d);
    d.then(() => this._drains.delete(d));
  }

  // Shutdown: deregister, wait for the handlers in flight (at most the
  // drain timeout) and their answers, then close the link with 1000.
  async _shutdown(link) {
    const deadline = Date.now() + this.drainTimeoutMs;
    try {
      await link.call('agent.deregister', { agentId: this.id, reason: 'shutdown' }, { timeoutMs: Math.max(1, Math.min(DEREGISTER_TIMEOUT_MS, this.drainTimeoutMs)) });
    } catch (e) {
      this.log.warn('deregister failed', { hub: link.url, error: e.message });
    }
    if (!(await this._whenIdle(deadline - Date.now()))) {
      this.log.warn('drain timed out', { inflight: this._inflight });
    }
    await link.whenIdle(Math.max(0, deadline - Date.now()));
    await link.close(1000);
  }

  _whenIdle(timeoutMs) {
    return new Promise((resolve) => {
      if (this._inflight === 0) {
        resolve(true);
        return;
      }
      const w = (v) => {
        clearTimeout(t);
        this._idleWaiters.delete(w);
        resolve(v);
      };
      const t = setTimeout(() => w(false), Math.max(0, timeoutMs));
      this._idleWaiters.add(w);
    });
  }

  // --- serving ---

  async _serve(frame, signal) {
    if (Object.hasOwn(frame, 'stream')) {
      throw new MeshError(INVALID_REQUEST, `${frame.method} was called as a stream: this agent (TypeScript SDK) serves no streams`);
    }
    const fn = this._handler(frame.method);
    if (fn === null) throw new MeshError(METHOD_NOT_FOUND, `agent ${this.id} does not serve "${frame.method}"`);
    const headers = frame.headers !== null && typeof frame.headers === 'object' && !Array.isArray(frame.headers) ? frame.headers : {};
    const str = (v) => (typeof v === 'string' ? v : '');
    const ctx = {
      signal,
      method: frame.method,
      requestId: str(frame.id),
      headers,
      traceparent: str(headers.traceparent),
      tracestate: str(headers.tracestate),
      baggage: str(headers.baggage),
      origin: str(frame.origin),
      agent: this,
    };
    this._inflight++;
    try {
      return await fn(frame.params === undefined ? null : frame.params, ctx);
    } catch (e) {
      if (signal.aborted && signal.reason instanceof MeshError && isAbortError(e, signal)) throw signal.reason;
      if (!(e instanceof MeshError)) this.log.debug('handler failed', { method: frame.method, error: e instanceof Error ? e.message : String(e) });
      throw MeshError.from(e);
    } finally {
      this._inflight--;
      if (this._inflight === 0) for (const w of [...this._idleWaiters]) w(true);
    }
  }
}
