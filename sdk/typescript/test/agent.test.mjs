import assert from 'node:assert/strict';
import { hostname } from 'node:os';
import { test as nodeTest } from 'node:test';

import { Agent, MeshError, SDK_VERSION } from '../src/index.js';
import { FakeHub, delay, until } from '../testlib/fakehub.mjs';

// A test that hangs fails instead (after 10 s), and its after-hooks still run.
const test = (name, fn) => nodeTest(name, { timeout: 10_000 }, fn);

async function withHub(t, opts) {
  const hub = await FakeHub.start(opts);
  t.after(() => hub.close());
  return hub;
}

// An agent with the test handlers, run against hubs; stopped when the
// test ends (before its hubs close: t.after runs in reverse order).
function startAgent(t, hubs, opts = {}) {
  const agent = new Agent({ name: 'ts', hubs, pingIntervalMs: 0, ...opts });
  agent.handle('ts.echo', (p) => p);
  agent.handle('ts.fail', (p) => {
    throw new Error(p.message);
  });
  agent.handle('ts.typed', () => {
    throw new MeshError('INVALID_PARAMS', 'key is required', { details: { field: 'key' } });
  });
  agent.handle('ts.ctx', (_p, ctx) => ({ traceparent: ctx.traceparent, tracestate: ctx.tracestate, requestId: ctx.requestId, method: ctx.method, ttl: ctx.headers.ttl ?? null }));
  agent.handle('wild.*', (p, ctx) => ({ via: 'pattern', method: ctx.method }));
  agent.handle('wild.exact', () => ({ via: 'exact' }));
  // Waits for its signal; records the reason.
  agent.seen = new Map();
  agent.handle('ts.wait', (p, ctx) => {
    return new Promise((resolve, reject) => {
      ctx.signal.addEventListener('abort', () => {
        agent.seen.set(p.key, ctx.signal.reason);
        reject(ctx.signal.reason);
      });
    });
  });
  agent.handle('ts.sleep', (p) => new Promise((r) => setTimeout(() => r({ slept: p.ms }), p.ms)));
  const running = agent.run();
  running.catch(() => {}); // the tests that expect a rejection await it themselves
  agent.running = running;
  t.after(() => agent.stop());
  return agent;
}

test('register: agentId, name, capabilities, intents and metadata; heartbeats every interval', async (t) => {
  const hub = await withHub(t, { heartbeatInterval: 0.1 });
  const agent = startAgent(t, hub.url, { id: 'agent-fixed-id', metadata: { team: 'x' } });
  const reg = await agent.registered;
  assert.equal(reg.agentId, 'agent-fixed-id');
  assert.equal(reg.hub, hub.url);
  assert.equal(reg.heartbeatIntervalMs, 100);
  assert.equal(agent.isRegistered, true);
  const p = hub.registrations[0].params;
  assert.equal(p.agentId, 'agent-fixed-id');
  assert.equal(p.name, 'ts');
  assert.deepEqual(p.capabilities, ['ts.ctx', 'ts.echo', 'ts.fail', 'ts.sleep', 'ts.typed', 'ts.wait', 'wild.*', 'wild.exact']);
  assert.deepEqual(p.intents, ['serve']);
  assert.equal(p.metadata.sdk, 'typescript');
  assert.equal(p.metadata.version, SDK_VERSION);
  assert.equal(p.metadata.hostname, hostname());
  assert.equal(p.metadata.pid, process.pid);
  assert.equal(p.metadata.team, 'x');
  assert.equal(hub.registrations[0].conn.protocol, 'agentmesh.v1');
  // Cadence: about one heartbeat per 100 ms.
  const t0 = Date.now();
  await delay(550);
  const beats = hub.requests('agent.heartbeat').filter((f) => f._at >= t0);
  assert.ok(beats.length >= 4 && beats.length <= 7, `${beats.length} heartbeats in 550 ms at 100 ms`);
  const b = beats[0];
  assert.equal(b.params.agentId, 'agent-fixed-id');
  assert.equal(b.params.status.state, 'ready');
  assert.equal(typeof b.params.status.queuedRequests, 'number');
  assert.ok(Math.abs(b.params.status.lastActivity - Date.now()) < 5000);
  assert.ok(b.headers.ttl > 0 && b.headers.ttl <= 100, 'a heartbeat is bounded by the interval');
  const gaps = beats.slice(1).map((f, i) => f._at - beats[i]._at);
  for (const g of gaps) assert.ok(g >= 60 && g <= 200, `gap ${g} ms`);
});

test('liveness "link": no heartbeats', async (t) => {
  const hub = await withHub(t, { heartbeatInterval: 0.05, liveness: 'link' });
  const agent = startAgent(t, hub.url);
  const reg = await agent.registered;
  assert.equal(reg.liveness, 'link');
  await delay(300);
  assert.equal(hub.requests('agent.heartbeat').length, 0);
});

test('the hub assigns the agent id; it is kept; an id is proposed by default (UUIDv7)', async (t) => {
  const hub = await withHub(t, {
    handlers: { 'agent.register': (p) => ({ result: { agentId: 'assigned-by-hub', accepted: true, heartbeatInterval: 0.05 } }) },
  });
  const agent = startAgent(t, hub.url);
  assert.match(agent.id, /^[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$/);
  await agent.registered;
  assert.equal(agent.id, 'assigned-by-hub');
  const beat = await hub.waitFrame((f) => f.method === 'agent.heartbeat');
  assert.equal(beat.params.agentId, 'assigned-by-hub');
});

test('AGENT_NOT_FOUND on a heartbeat: register again on the same link, same id', async (t) => {
  const hub = await withHub(t, { heartbeatInterval: 0.05 });
  const agent = startAgent(t, hub.url);
  await agent.registered;
  const id = agent.id;
  hub.expire = true;
  await until(() => hub.registrations.length >= 2, 2000, 'a second registration');
  hub.expire = false;
  assert.equal(hub.registrations[1].conn, hub.registrations[0].conn, 'on the same link');
  assert.equal(hub.registrations[1].params.agentId, id);
  assert.equal(hub.conns.length, 1);
  // Heartbeats go on after it.
  const n = hub.requests('agent.heartbeat').length;
  await until(() => hub.requests('agent.heartbeat').length > n + 1, 2000, 'heartbeats again');
});

test('reconnect after the hub drops the link: same id, within the first backoff ceiling', async (t) => {
  const hub = await withHub(t, { heartbeatInterval: 5 });
  const agent = startAgent(t, hub.url);
  await agent.registered;
  const id = agent.id;
  const disconnected = new Promise((r) => agent.once('disconnected', r));
  const t0 = Date.now();
  hub.conns[0].drop();
  const ev = await disconnected;
  assert.equal(ev.error.code, 'UNAVAILABLE');
  assert.ok(ev.delayMs >= 100 && ev.delayMs <= 1000, `first redial in [100 ms, 1 s]: ${ev.delayMs}`);
  await until(() => hub.registrations.length === 2, 3000, 're-registration');
  const took = Date.now() - t0;
  assert.ok(took >= 95 && took < 1500, `re-registered after ${took} ms`);
  assert.equal(hub.registrations[1].params.agentId, id);
  assert.notEqual(hub.registrations[1].conn, hub.registrations[0].conn);
  await agent.registered;
  assert.equal(agent.isRegistered, true);
});

test('a registered link lost while several hubs are listed moves to the next hub within min(2 s, interval)', async (t) => {
  const a = await withHub(t, { heartbeatInterval: 0.2 });
  const b = await withHub(t, { heartbeatInterval: 0.2 });
  const agent = startAgent(t, [a.url, b.url]);
  await agent.registered;
  const disconnected = new Promise((r) => agent.once('disconnected', r));
  a.conns[0].drop();
  const ev = await disconnected;
  assert.ok(ev.delayMs >= 0 && ev.delayMs < 200, `spread over the 200 ms interval: ${ev.delayMs}`);
  await until(() => b.registrations.length === 1, 2000, 'registered on the second hub');
  assert.equal(b.registrations[0].params.agentId, agent.id);
});

test('answers: result; a throw is INTERNAL_ERROR with its message; a MeshError keeps its code; unknown is METHOD_NOT_FOUND', async (t) => {
  const hub = await withHub(t);
  const agent = startAgent(t, hub.url);
  await agent.registered;
  const conn = hub.conns[0];
  let r = await conn.call('ts.echo', { a: [1, { b: null }] }).answer;
  assert.deepEqual(r.result, { a: [1, { b: null }] });
  assert.equal(r.id, 'req-' + r.seq, 'the answer carries the request id');
  r = await conn.call('ts.echo').answer;
  assert.equal(r.result, null, 'absent params are null, and so is the result');
  r = await conn.call('ts.fail', { message: 'boom' }).answer;
  assert.equal(r.error.code, 'INTERNAL_ERROR');
  assert.equal(r.error.rpcCode, -32603);
  assert.equal(r.error.message, 'boom');
  assert.ok(!('result' in r));
  r = await conn.call('ts.typed', {}).answer;
  assert.deepEqual(r.error, { code: 'INVALID_PARAMS', rpcCode: -32602, message: 'key is required', retryable: false, details: { field: 'key' } });
  r = await conn.call('ts.nope', {}).answer;
  assert.equal(r.error.code, 'METHOD_NOT_FOUND');
  r = await conn.call('wild.anything', {}).answer;
  assert.deepEqual(r.result, { via: 'pattern', method: 'wild.anything' });
  r = await conn.call('wild.exact', {}).answer;
  assert.deepEqual(r.result, { via: 'exact' }, 'an exact name wins over a pattern');
});

test('ctx: traceparent, tracestate, request id, method and headers as the request carried them', async (t) => {
  const hub = await withHub(t);
  const agent = startAgent(t, hub.url);
  await agent.registered;
  const tp = '00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01';
  const r = await hub.conns[0].call('ts.ctx', {}, { id: 'rid-1', headers: { traceparent: tp, tracestate: 'a=b', ttl: 5000 } }).answer;
  assert.deepEqual(r.result, { traceparent: tp, tracestate: 'a=b', requestId: 'rid-1', method: 'ts.ctx', ttl: 5000 });
  const r2 = await hub.conns[0].call('ts.ctx', {}).answer;
  assert.equal(r2.result.traceparent, '');
  assert.equal(r2.result.tracestate, '');
});

test('a cancel frame fires the handler\'s signal with CANCELLED', async (t) => {
  const hub = await withHub(t);
  const agent = startAgent(t, hub.url);
  await agent.registered;
  const conn = hub.conns[0];
  const { seq, answer } = conn.call('ts.wait', { key: 'c' });
  await until(() => agent.inflight === 1, 2000, 'the handler running');
  conn.send({ type: 'cancel', seq });
  const r = await answer; // an answer after a cancel is allowed
  assert.equal(r.error.code, 'CANCELLED');
  assert.equal(agent.seen.get('c').code, 'CANCELLED');
  assert.ok(agent.seen.get('c') instanceof MeshError);
  assert.equal(agent.inflight, 0);
});

test('headers.ttl fires the handler\'s signal with TIMEOUT after ttl ms', async (t) => {
  const hub = await withHub(t);
  const agent = startAgent(t, hub.url);
  await agent.registered;
  const t0 = Date.now();
  const r = await hub.conns[0].call('ts.wait', { key: 't' }, { headers: { ttl: 120 } }).answer;
  const took = Date.now() - t0;
  assert.equal(r.error.code, 'TIMEOUT');
  assert.equal(agent.seen.get('t').code, 'TIMEOUT');
  assert.ok(took >= 110 && took < 1000, `fired after ${took} ms`);
});

test('a lost link fires the signal of its handlers with UNAVAILABLE', async (t) => {
  const hub = await withHub(t);
  const agent = startAgent(t, hub.url);
  await agent.registered;
  hub.conns[0].call('ts.wait', { key: 'l' });
  await until(() => agent.inflight === 1, 2000, 'the handler running');
  hub.conns[0].drop();
  await until(() => agent.seen.has('l'), 2000, 'the signal fired');
  assert.equal(agent.seen.get('l').code, 'UNAVAILABLE');
});

test('a streaming request is answered with a res carrying INVALID_REQUEST', async (t) => {
  const hub = await withHub(t);
  const agent = startAgent(t, hub.url);
  await agent.registered;
  const r = await hub.conns[0].call('ts.echo', {}, { stream: 8 }).answer;
  assert.equal(r.type, 'res');
  assert.equal(r.error.code, 'INVALID_REQUEST');
});

test('a batch of requests is served frame by frame; answers of one turn go out batched', async (t) => {
  const hub = await withHub(t);
  const agent = startAgent(t, hub.url);
  await agent.registered;
  const conn = hub.conns[0];
  const reqs = [1, 2, 3].map((i) => conn.request('ts.echo', { i }));
  const bad = conn.request('ts.fail', { message: 'x' });
  const before = conn.messages.length;
  conn.send([...reqs.map((r) => r.frame), bad.frame, { type: 'credit', seq: 99, n: 1 }]);
  const answers = await Promise.all(reqs.map((r) => r.answer));
  assert.deepEqual(
    answers.map((a) => a.result),
    [{ i: 1 }, { i: 2 }, { i: 3 }],
  );
  assert.equal((await bad.answer).error.code, 'INTERNAL_ERROR');
  const msgs = conn.messages.slice(before);
  assert.ok(msgs.length < 4, `the four answers came in ${msgs.length} messages`);
  assert.ok(msgs.some((m) => m.startsWith('[')), 'at least one batch');
});

test('stop: deregister first, the handlers in flight answered, then close 1000; run resolves', async (t) => {
  const hub = await withHub(t);
  const agent = startAgent(t, hub.url);
  await agent.registered;
  const conn = hub.conns[0];
  const { answer } = conn.call('ts.sleep', { ms: 200 });
  await until(() => agent.inflight === 1, 2000, 'the handler running');
  const t0 = Date.now();
  await agent.stop();
  const took = Date.now() - t0;
  const r = await answer;
  assert.deepEqual(r.result, { slept: 200 });
  const dereg = conn.frames.findIndex((f) => f.method === 'agent.deregister');
  const ans = conn.frames.findIndex((f) => f.type === 'res' && f.result?.slept === 200);
  assert.ok(dereg >= 0 && dereg < ans, 'deregister sent before the answer');
  assert.deepEqual(conn.frames[dereg].params, { agentId: agent.id, reason: 'shutdown' });
  const { code } = await conn.closed;
  assert.equal(code, 1000);
  assert.ok(took >= 150 && took < 1500, `drained in ${took} ms`);
  await agent.running; // resolved
  assert.equal(agent.isRegistered, false);
});

test('stop: the drain is bounded by drainTimeoutMs', async (t) => {
  const hub = await withHub(t);
  const agent = startAgent(t, hub.url, { drainTimeoutMs: 150 });
  await agent.registered;
  hub.conns[0].call('ts.wait', { key: 'd' });
  await until(() => agent.inflight === 1, 2000, 'the handler running');
  const t0 = Date.now();
  await agent.stop();
  const took = Date.now() - t0;
  assert.ok(took >= 140 && took < 1000, `stopped after ${took} ms`);
  assert.equal((await hub.conns[0].closed).code, 1000);
  await until(() => agent.seen.has('d'), 1000, 'the handler told');
  assert.equal(agent.seen.get('d').code, 'UNAVAILABLE', 'the link closed under it');
});

test('run({signal}): the signal stops the agent', async (t) => {
  const hub = await withHub(t);
  const agent = new Agent({ name: 'ts', hubs: hub.url, pingIntervalMs: 0 });
  agent.handle('ts.echo', (p) => p);
  const ac = new AbortController();
  const running = agent.run({ signal: ac.signal });
  t.after(() => agent.stop());
  await agent.registered;
  ac.abort();
  await running;
  assert.equal(hub.requests('agent.deregister').length, 1);
  assert.equal((await hub.conns[0].closed).code, 1000);
});

test('stop before any hub answers: run resolves, registered rejects', async (t) => {
  const dead = await FakeHub.start();
  const url = dead.url;
  await dead.close();
  const agent = new Agent({ name: 'ts', hubs: url, pingIntervalMs: 0 });
  agent.handle('ts.echo', (p) => p);
  const running = agent.run();
  const reg = agent.registered;
  await new Promise((r) => agent.once('disconnected', r));
  await agent.stop();
  await running;
  await assert.rejects(reg, (e) => e.code === 'UNAVAILABLE');
});

test('goaway: register on the next hub, then deregister on the old link and close it once its handlers answered', async (t) => {
  const a = await withHub(t, { heartbeatInterval: 0.05 });
  // The next hub takes 250 ms to answer the registration: meanwhile the
  // old link is heartbeated, so that the draining hub does not expire the
  // agent and fail what it serves there.
  let answeredAt = Infinity;
  const b = await withHub(t, {
    handlers: {
      'agent.register': async (p) => {
        await delay(250);
        answeredAt = Date.now();
        return { result: { agentId: p.agentId, accepted: true, heartbeatInterval: 0.05 } };
      },
    },
  });
  const agent = startAgent(t, [a.url, b.url]);
  await agent.registered;
  const old = a.conns[0];
  const { answer } = old.call('ts.sleep', { ms: 500 });
  await until(() => agent.inflight === 1, 2000, 'the handler running');
  old.send({ type: 'goaway' });
  const goawayAt = Date.now();
  await until(() => b.registrations.length === 1, 2000, 'registered on the next hub');
  assert.equal(b.registrations[0].params.agentId, agent.id);
  const dereg = await old.waitFrame((f) => f.method === 'agent.deregister');
  const kept = old.frames.filter((f) => f.method === 'agent.heartbeat' && f._at > goawayAt && f._at < dereg._at);
  assert.ok(kept.length >= 2, `the old link heartbeated while the agent moved: ${kept.length}`);
  assert.equal(dereg.params.agentId, agent.id);
  assert.ok(dereg._at >= answeredAt, 'deregistered after registering elsewhere');
  let closed = false;
  old.closed.then(() => (closed = true));
  await delay(50);
  assert.equal(closed, false, 'the old link stays open while it serves');
  assert.deepEqual((await answer).result, { slept: 500 });
  assert.equal((await old.closed).code, 1000);
  await agent.registered;
  assert.equal(agent._reg.hub, b.url);
});

test('a refused token ends run with UNAUTHENTICATED', async (t) => {
  const hub = await withHub(t, { status: 401 });
  const agent = new Agent({ name: 'ts', hubs: hub.url, token: 'bad', pingIntervalMs: 0 });
  agent.handle('ts.echo', (p) => p);
  await assert.rejects(agent.run(), (e) => e instanceof MeshError && e.code === 'UNAUTHENTICATED');
});

test('the token goes in Authorization: Bearer', async (t) => {
  const hub = await withHub(t);
  const agent = startAgent(t, hub.url, { token: 'tok-123' });
  await agent.registered;
  assert.equal(hub.conns[0].headers.authorization, 'Bearer tok-123');
});

test('run without handlers rejects; handle checks names', async () => {
  const agent = new Agent({ name: 'ts', hubs: 'ws://127.0.0.1:1/ws' });
  await assert.rejects(agent.run(), /no handlers/);
  assert.throws(() => agent.handle('bad name', () => 1), TypeError);
  assert.throws(() => agent.handle('a*', () => 1), TypeError);
  assert.throws(() => agent.handle('a.*.b', () => 1), TypeError);
  assert.throws(() => agent.handle('ok.name', 'not a function'), TypeError);
  agent.handle('a.*', () => 1).handle('a.b', () => 2);
  assert.deepEqual(agent.methods(), ['a.*', 'a.b']);
});

test('nothing leaks: after stop, no timer or socket of the agent is left', async (t) => {
  const before = process.getActiveResourcesInfo().filter((r) => r !== 'TTYWrap');
  const hub = await FakeHub.start({ heartbeatInterval: 0.05 });
  const agent = new Agent({ name: 'ts', hubs: hub.url, pingIntervalMs: 20 });
  agent.handle('ts.sleep', (p) => new Promise((r) => setTimeout(() => r(p), p.ms)));
  const running = agent.run();
  await agent.registered;
  const { answer } = hub.conns[0].call('ts.sleep', { ms: 30 }, { headers: { ttl: 10000 } });
  await answer;
  hub.conns[0].call('ts.sleep', { ms: 40 }, { headers: { ttl: 10000 } });
  await delay(5);
  await agent.stop();
  await running;
  await hub.close();
  await delay(20);
  const after = process.getActiveResourcesInfo().filter((r) => r !== 'TTYWrap');
  const count = (l, k) => l.filter((r) => r === k).length;
  assert.ok(count(after, 'Timeout') <= count(before, 'Timeout'), `timers: ${before} -> ${after}`);
  assert.ok(count(after, 'TCPSocketWrap') <= count(before, 'TCPSocketWrap'), `sockets: ${before} -> ${after}`);
  assert.ok(count(after, 'TCPServerWrap') <= count(before, 'TCPServerWrap'), `servers: ${before} -> ${after}`);
});
