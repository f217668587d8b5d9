// A small fake hub for the tests: a real WebSocket server on a loopback
// port speaking agentmesh.v1 frames, scripted by the test. (It lives out
// of test/ so that node --test does not run it as a test file.)

import { EventEmitter } from 'node:events';
import { WebSocketServer } from 'ws';

/** One accepted link, as the fake hub sees it. */
export class FakeConn extends EventEmitter {
  constructor(hub, ws, req) {
    super();
    this.hub = hub;
    this.ws = ws;
    this.headers = req.headers;
    this.protocol = ws.protocol;
    this.frames = []; // every frame received, in order
    this.messages = []; // every raw message received
    this.seq = 0;
    this.pending = new Map();
    this.closed = new Promise((resolve) => ws.on('close', (code, reason) => resolve({ code, reason: reason.toString() })));
    ws.on('message', (data) => this._onMessage(data.toString()));
  }

  _onMessage(text) {
    this.messages.push(text);
    const v = JSON.parse(text);
    for (const f of Array.isArray(v) ? v : [v]) {
      f._at = Date.now();
      this.frames.push(f);
      this.hub.frames.push({ conn: this, frame: f });
      if (f.type === 'res' && this.pending.has(f.seq)) {
        const r = this.pending.get(f.seq);
        this.pending.delete(f.seq);
        r(f);
      }
      if (f.type === 'req') this.hub._serve(this, f);
      this.emit('frame', f);
      this.hub.emit('frame', f, this);
    }
  }

  /** Sends a frame, or an array of frames as one batch message. */
  send(frame) {
    this.ws.send(JSON.stringify(frame));
  }

  /** Sends a request to the peer; resolves with its "res" frame. */
  call(method, params, extra = {}) {
    const seq = ++this.seq;
    const f = { type: 'req', seq, id: `req-${seq}`, method, ...extra };
    if (params !== undefined) f.params = params;
    const p = new Promise((resolve) => this.pending.set(seq, resolve));
    this.send(f);
    return { seq, answer: p };
  }

  /** A request frame (with a fresh seq) and the promise of its answer, without sending it. */
  request(method, params, extra = {}) {
    const seq = ++this.seq;
    const f = { type: 'req', seq, id: `req-${seq}`, method, ...extra };
    if (params !== undefined) f.params = params;
    const answer = new Promise((resolve) => this.pending.set(seq, resolve));
    return { frame: f, seq, answer };
  }

  /** Resolves with the first frame received (past or future) matching pred. */
  waitFrame(pred, timeoutMs = 3000) {
    const hit = this.frames.find(pred);
    if (hit) return Promise.resolve(hit);
    return waitEvent(this, 'frame', pred, timeoutMs);
  }

  /** Drops the TCP connection without a close frame. */
  drop() {
    this.ws.terminate();
    return this.closed;
  }
}

function waitEvent(emitter, event, pred, timeoutMs) {
  return new Promise((resolve, reject) => {
    const on = (...args) => {
      if (!pred(...args)) return;
      clearTimeout(t);
      emitter.off(event, on);
      resolve(args[0]);
    };
    const t = setTimeout(() => {
      emitter.off(event, on);
      reject(new Error(`no ${event} matching within ${timeoutMs} ms`));
    }, timeoutMs);
    emitter.on(event, on);
  });
}

/**
 * FakeHub accepts links on 127.0.0.1 (a free port), selects the
 * agentmesh.v1 subprotocol, and answers the control methods:
 * agent.register (records it; answers heartbeatInterval and liveness),
 * agent.heartbeat (AGENT_NOT_FOUND while expire is set), agent.deregister,
 * mesh.ping. Other methods go to handlers[method](params, frame, conn),
 * which returns {result} or {error} or null (no answer), or a promise of it.
 */
export class FakeHub extends EventEmitter {
  static async start(opts = {}) {
    const hub = new FakeHub(opts);
    await hub._listen();
    return hub;
  }

  constructor(opts) {
    super();
    this.heartbeatInterval = opts.heartbeatInterval ?? 5; // seconds
    this.liveness = opts.liveness; // "link" or undefined
    this.subprotocol = opts.subprotocol ?? 'agentmesh.v1'; // what the server selects (false: none)
    this.status = opts.status; // refuse every upgrade with this HTTP status
    this.autoPong = opts.autoPong ?? true;
    this.handlers = opts.handlers ?? {};
    this.conns = [];
    this.frames = []; // {conn, frame} of every frame received
    this.registrations = [];
    this.expire = false; // heartbeats answer AGENT_NOT_FOUND while set
  }

  _listen() {
    return new Promise((resolve, reject) => {
      const wss = new WebSocketServer({
        host: '127.0.0.1',
        port: 0,
        autoPong: this.autoPong,
        handleProtocols: (protocols) => (this.subprotocol && protocols.has(this.subprotocol) ? this.subprotocol : false),
        verifyClient: this.status ? (_info, cb) => cb(false, this.status) : undefined,
      });
      this.wss = wss;
      wss.once('error', reject);
      wss.once('listening', () => {
        this.port = wss.address().port;
        this.url = `ws://127.0.0.1:${this.port}/ws`;
        resolve();
      });
      wss.on('connection', (ws, req) => {
        const c = new FakeConn(this, ws, req);
        this.conns.push(c);
        this.emit('connection', c);
      });
    });
  }

  /** Resolves with the first link (past or future) matching pred. */
  waitConn(pred = () => true, timeoutMs = 3000) {
    const hit = this.conns.find(pred);
    if (hit) return Promise.resolve(hit);
    return waitEvent(this, 'connection', pred, timeoutMs);
  }

  /** Resolves with the nth link (0-based) once it exists. */
  nthConn(n, timeoutMs = 3000) {
    return this.waitConn(() => this.conns.length > n, timeoutMs).then(() => this.conns[n]);
  }

  /** Resolves with the first frame (past or future, any link) matching pred. */
  waitFrame(pred, timeoutMs = 3000) {
    const hit = this.frames.find(({ conn, frame }) => pred(frame, conn));
    if (hit) return Promise.resolve(hit.frame);
    return waitEvent(this, 'frame', pred, timeoutMs);
  }

  /** Frames received of request method (any link). */
  requests(method) {
    return this.frames.filter(({ frame }) => frame.type === 'req' && frame.method === method).map(({ frame }) => frame);
  }

  async _serve(conn, f) {
    let out;
    switch (f.method) {
      case 'agent.register':
        this.registrations.push({ conn, params: f.params });
        out = this.handlers['agent.register']
          ? await this.handlers['agent.register'](f.params, f, conn)
          : {
              result: {
                agentId: f.params.agentId,
                accepted: true,
                heartbeatInterval: this.heartbeatInterval,
                assignedCapabilities: f.params.capabilities,
                ...(this.liveness ? { liveness: this.liveness } : {}),
              },
            };
        break;
      case 'agent.heartbeat':
        out = this.expire
          ? { error: { code: 'AGENT_NOT_FOUND', rpcCode: -32001, message: `agent.heartbeat: agent "${f.params.agentId}" expired; register again` } }
          : { result: { acknowledged: true } };
        break;
      case 'agent.deregister':
        out = { result: { acknowledged: true, gracePeriod: 10 } };
        break;
      default: {
        const h = this.handlers[f.method] ?? (f.method === 'mesh.ping' ? () => ({ result: { pong: true } }) : null);
        out = h
          ? await h(f.params, f, conn)
          : { error: { code: 'METHOD_NOT_FOUND', rpcCode: -32601, message: `no agent serves "${f.method}"` } };
      }
    }
    if (out && conn.ws.readyState === 1) conn.send({ type: 'res', seq: f.seq, id: f.id, ...out });
  }

  /** Stops listening and drops every link. */
  close() {
    for (const c of this.conns) c.ws.terminate();
    return new Promise((resolve) => this.wss.close(() => resolve()));
  }
}

/** Resolves after ms. */
export const delay = (ms) => new Promise((r) => setTimeout(r, ms));

/** Polls cond every 5 ms until true; rejects after timeoutMs. */
export async function until(cond, timeoutMs = 3000, what = 'condition') {
  const end = Date.now() + timeoutMs;
  while (!(await cond())) {
    if (Date.now() > end) throw new Error(`${what} not met within ${timeoutMs} ms`);
    await delay(5);
  }
}
