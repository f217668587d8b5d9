import assert from 'node:assert/strict';
import { test as nodeTest } from 'node:test';

import { Client, Link, MeshError, wsURL } from '../src/index.js';
import { FakeHub, delay, until } from '../testlib/fakehub.mjs';

// A test that hangs fails instead (after 10 s), and its after-hooks still run.
const test = (name, fn) => nodeTest(name, { timeout: 10_000 }, fn);

// Each test starts its own fake hub(s) and closes them (and its client)
// when it ends, whatever the outcome.
async function withHub(t, opts) {
  const hub = await FakeHub.start(opts);
  t.after(() => hub.close());
  return hub;
}

function client(t, opts) {
  const c = new Client(opts);
  t.after(() => c.close());
  return c;
}

const rejectsWith = async (p, code) => {
  const err = await p.then(
    (v) => assert.fail(`expected ${code}, got result ${JSON.stringify(v)}`),
    (e) => e,
  );
  assert.ok(err instanceof MeshError, `a MeshError, got ${err}`);
  assert.equal(err.code, code, err.message);
  return err;
};

test('wsURL normalises hub addresses as the Go SDK does', () => {
  assert.equal(wsURL('127.0.0.1:7700'), 'ws://127.0.0.1:7700/ws');
  assert.equal(wsURL('http://h:1'), 'ws://h:1/ws');
  assert.equal(wsURL('https://h:1/rpc'), 'wss://h:1/ws');
  assert.equal(wsURL('ws://h:1/custom'), 'ws://h:1/custom');
  assert.throws(() => wsURL('ftp://h:1'), /scheme/);
  assert.throws(() => wsURL(''), TypeError);
});

test('call: result, params, request id, headers.ttl and traceparent on the wire', async (t) => {
  const hub = await withHub(t, { handlers: { 'echo.echo': (p) => ({ result: p }) } });
  const c = client(t, { hubs: hub.url, timeoutMs: 4000 });
  const tp = '00-0123456789abcdef0123456789abcdef-0123456789abcdef-01';
  assert.deepEqual(await c.call('echo.echo', { a: [1, 'x'] }, { traceparent: tp, tracestate: 'k=v', headers: { correlationId: 'c1' } }), { a: [1, 'x'] });
  const f = hub.requests('echo.echo')[0];
  assert.equal(f.seq, 1);
  assert.equal(typeof f.id, 'string');
  assert.ok(f.id.length > 0);
  assert.ok(f.headers.ttl > 3900 && f.headers.ttl <= 4000, `ttl ${f.headers.ttl}`);
  assert.equal(f.headers.traceparent, tp);
  assert.equal(f.headers.tracestate, 'k=v');
  assert.equal(f.headers.correlationId, 'c1');
  assert.equal(hub.conns[0].protocol, 'agentmesh.v1');
  // params absent: no params member (null); a result of null.
  hub.handlers['none.none'] = () => ({ result: null });
  assert.equal(await c.call('none.none'), null);
  assert.ok(!('params' in hub.requests('none.none')[0]));
  assert.equal(hub.requests('none.none')[0].seq, 2, 'seq counts per link');
  assert.equal(hub.conns.length, 1, 'one link for both calls');
});

test('call: the hub\'s error is a MeshError with its code, message and details', async (t) => {
  const hub = await withHub(t, {
    handlers: { 'x.fail': () => ({ error: { code: 'INVALID_PARAMS', rpcCode: -32602, message: 'bad key', retryable: false, details: { field: 'key' } } }) },
  });
  const c = client(t, { hubs: hub.url });
  const e = await rejectsWith(c.call('x.fail', {}), 'INVALID_PARAMS');
  assert.equal(e.message, 'bad key');
  assert.equal(e.rpcCode, -32602);
  assert.deepEqual(e.details, { field: 'key' });
  await rejectsWith(c.call('nobody.serves'), 'METHOD_NOT_FOUND');
});

test('call: on its timeout the client sends a cancel for that seq and rejects TIMEOUT', async (t) => {
  const hub = await withHub(t, { handlers: { 'slow.op': () => null /* never answers */ } });
  const c = client(t, { hubs: hub.url });
  const t0 = Date.now();
  const e = await rejectsWith(c.call('slow.op', {}, { timeoutMs: 150 }), 'TIMEOUT');
  const took = Date.now() - t0;
  assert.ok(took >= 140 && took < 1000, `took ${took} ms`);
  assert.match(e.message, /150 ms/);
  const req = hub.requests('slow.op')[0];
  const cancel = await hub.waitFrame((f) => f.type === 'cancel');
  assert.equal(cancel.seq, req.seq);
  // A late answer for a call given up is dropped, and the link goes on.
  hub.conns[0].send({ type: 'res', seq: req.seq, result: 'late' });
  hub.handlers['fast.op'] = () => ({ result: 1 });
  assert.equal(await c.call('fast.op'), 1);
});

test('call: an abort sends a cancel and rejects CANCELLED; an aborted signal sends nothing', async (t) => {
  const hub = await withHub(t, { handlers: { 'slow.op': () => null } });
  const c = client(t, { hubs: hub.url });
  const ac = new AbortController();
  const p = c.call('slow.op', {}, { signal: ac.signal });
  const req = await hub.waitFrame((f) => f.type === 'req' && f.method === 'slow.op');
  ac.abort();
  await rejectsWith(p, 'CANCELLED');
  const cancel = await hub.waitFrame((f) => f.type === 'cancel');
  assert.equal(cancel.seq, req.seq);
  const e = await rejectsWith(c.call('slow.op', {}, { signal: AbortSignal.abort() }), 'CANCELLED');
  assert.equal(e.notSent, true);
  await delay(20);
  assert.equal(hub.requests('slow.op').length, 1);
});

test('call: a lost link fails the calls on it with UNAVAILABLE; the next call redials the next hub', async (t) => {
  const a = await withHub(t, { handlers: { 'slow.op': () => null, 'who.am': () => ({ result: 'a' }) } });
  const b = await withHub(t, { handlers: { 'who.am': () => ({ result: 'b' }) } });
  const c = client(t, { hubs: [a.url, b.url] });
  assert.equal(await c.call('who.am'), 'a');
  const p = c.call('slow.op', {}, { timeoutMs: 5000 });
  await a.waitFrame((f) => f.method === 'slow.op');
  const t0 = Date.now();
  a.conns[0].drop();
  const e = await rejectsWith(p, 'UNAVAILABLE');
  assert.ok(Date.now() - t0 < 1000, 'at once, not at the timeout');
  assert.equal(e.notSent, false, 'it was sent: it may have run');
  assert.equal(await c.call('who.am'), 'b');
  assert.equal(c.hub, b.url);
});

test('call: a hub that cannot be reached is skipped; none reachable is UNAVAILABLE notSent', async (t) => {
  const b = await withHub(t, { handlers: { 'who.am': () => ({ result: 'b' }) } });
  const dead = await FakeHub.start();
  const deadURL = dead.url;
  await dead.close();
  const c = client(t, { hubs: [deadURL, b.url] });
  assert.equal(await c.call('who.am'), 'b');
  const c2 = client(t, { hubs: deadURL });
  const e = await rejectsWith(c2.call('who.am'), 'UNAVAILABLE');
  assert.equal(e.notSent, true);
});

test('call: batch messages from the hub are handled frame by frame', async (t) => {
  const hub = await withHub(t, { handlers: { 'slow.op': () => null } });
  const c = client(t, { hubs: hub.url });
  const p1 = c.call('slow.op', 1);
  const p2 = c.call('slow.op', 2);
  const p3 = c.call('slow.op', 3);
  await until(() => hub.requests('slow.op').length === 3, 2000, 'three requests');
  const [r1, r2, r3] = hub.requests('slow.op');
  hub.conns[0].send([
    { type: 'res', seq: r3.seq, result: 'three' },
    { type: 'res', seq: r1.seq, error: { code: 'OVERLOADED', message: 'full' } },
    { type: 'metrics', whatever: true },
    { type: 'res', seq: r2.seq, result: { two: 2 } },
  ]);
  assert.equal(await p3, 'three');
  assert.deepEqual(await p2, { two: 2 });
  await rejectsWith(p1, 'OVERLOADED');
});

test('calls made in one turn go out as one batch message', async (t) => {
  const hub = await withHub(t, { handlers: { 'echo.echo': (p) => ({ result: p }) } });
  const c = client(t, { hubs: hub.url });
  await c.call('echo.echo', 0); // dialled
  const before = hub.conns[0].messages.length;
  const out = await Promise.all([1, 2, 3, 4, 5].map((i) => c.call('echo.echo', i)));
  assert.deepEqual(out, [1, 2, 3, 4, 5]);
  const msgs = hub.conns[0].messages.slice(before);
  assert.equal(msgs.length, 1, `one message: ${msgs}`);
  assert.ok(msgs[0].startsWith('['));
});

test('the bearer token goes in Authorization; 401 is UNAUTHENTICATED, 403 PERMISSION_DENIED', async (t) => {
  const hub = await withHub(t);
  const c = client(t, { hubs: hub.url, token: 's3cret' });
  assert.deepEqual(await c.call('mesh.ping'), { pong: true });
  assert.equal(hub.conns[0].headers.authorization, 'Bearer s3cret');
  const h401 = await withHub(t, { status: 401 });
  await rejectsWith(client(t, { hubs: h401.url, token: 'bad' }).call('mesh.ping'), 'UNAUTHENTICATED');
  const h403 = await withHub(t, { status: 403 });
  await rejectsWith(client(t, { hubs: h403.url, token: 'bad' }).call('mesh.ping'), 'PERMISSION_DENIED');
  const h503 = await withHub(t, { status: 503 });
  const e = await rejectsWith(client(t, { hubs: h503.url }).call('mesh.ping'), 'UNAVAILABLE');
  assert.equal(e.notSent, true);
});

test('a server that does not select agentmesh.v1 is not a hub', async (t) => {
  const hub = await withHub(t, { subprotocol: false });
  const e = await rejectsWith(client(t, { hubs: hub.url }).call('mesh.ping'), 'UNAVAILABLE');
  assert.match(e.message, /agentmesh\.v1|subprotocol|protocol/i);
});

test('goaway: new calls go to the next hub; the old link closes once its calls are answered', async (t) => {
  let release;
  const a = await withHub(t, {
    handlers: {
      'who.am': () => ({ result: 'a' }),
      'slow.op': () => new Promise((r) => (release = () => r({ result: 'done on a' }))),
    },
  });
  const b = await withHub(t, { handlers: { 'who.am': () => ({ result: 'b' }) } });
  const c = client(t, { hubs: [a.url, b.url] });
  assert.equal(await c.call('who.am'), 'a');
  const slow = c.call('slow.op');
  await a.waitFrame((f) => f.method === 'slow.op');
  a.conns[0].send({ type: 'goaway' });
  await until(() => c.hub === null, 2000, 'the client left the draining link');
  assert.equal(await c.call('who.am'), 'b');
  let closed = false;
  a.conns[0].closed.then(() => (closed = true));
  await delay(30);
  assert.equal(closed, false, 'kept open while a call awaits its answer');
  release();
  assert.equal(await slow, 'done on a');
  const { code } = await a.conns[0].closed;
  assert.equal(code, 1000);
});

test('close: later calls fail at once; pending calls fail UNAVAILABLE', async (t) => {
  const hub = await withHub(t, { handlers: { 'slow.op': () => null } });
  const c = new Client({ hubs: hub.url });
  const p = c.call('slow.op');
  await hub.waitFrame((f) => f.method === 'slow.op');
  await c.close();
  await rejectsWith(p, 'UNAVAILABLE');
  const e = await rejectsWith(c.call('slow.op'), 'UNAVAILABLE');
  assert.equal(e.notSent, true);
  const { code } = await hub.conns[0].closed;
  assert.equal(code, 1000);
});

test('Link: a hub silent for two ping intervals is dead', async (t) => {
  const hub = await withHub(t, { autoPong: false, handlers: { 'slow.op': () => null } });
  const l = await Link.dial(hub.url, { pingIntervalMs: 40 });
  t.after(() => l.close());
  const t0 = Date.now(); // the hub was last heard from at the upgrade, just before
  const p = l.call('slow.op', {}, { timeoutMs: 5000 });
  const e = await rejectsWith(p, 'UNAVAILABLE');
  const took = Date.now() - t0;
  assert.match(e.message, /silent .* 2 pings/);
  assert.ok(took >= 70 && took < 1000, `dead after ${took} ms (2 intervals: 80 ms)`);
  assert.equal(l.isClosed, true);
});

test('Link: a hub that answers pings stays up', async (t) => {
  const hub = await withHub(t, { handlers: { 'who.am': () => ({ result: 'up' }) } });
  const l = await Link.dial(hub.url, { pingIntervalMs: 20 });
  t.after(() => l.close());
  await delay(200);
  assert.equal(l.isClosed, false);
  assert.equal(await l.call('who.am'), 'up');
});

test('Link.dial: a server that never completes the handshake is UNAVAILABLE after dialTimeoutMs', async (t) => {
  const net = await import('node:net');
  const sockets = new Set();
  const srv = net.createServer((s) => sockets.add(s)); // accepts, never answers
  await new Promise((r) => srv.listen(0, '127.0.0.1', r));
  t.after(() => {
    for (const s of sockets) s.destroy();
    return new Promise((r) => srv.close(r));
  });
  const t0 = Date.now();
  const e = await rejectsWith(Link.dial(`ws://127.0.0.1:${srv.address().port}/ws`, { dialTimeoutMs: 100 }), 'UNAVAILABLE');
  assert.equal(e.notSent, true);
  assert.ok(Date.now() - t0 < 1000);
  const ac = new AbortController();
  const p = Link.dial(`ws://127.0.0.1:${srv.address().port}/ws`, { signal: ac.signal });
  ac.abort();
  await rejectsWith(p, 'CANCELLED');
});

test('Link: the hub\'s own pings count as signs of life', async (t) => {
  const hub = await withHub(t, { autoPong: false, handlers: { 'who.am': () => ({ result: 'up' }) } });
  const l = await Link.dial(hub.url, { pingIntervalMs: 40 });
  t.after(() => l.close());
  const conn = await hub.nthConn(0);
  const pinger = setInterval(() => conn.ws.ping(), 15);
  t.after(() => clearInterval(pinger));
  await delay(250);
  assert.equal(l.isClosed, false, 'alive while the hub pings');
  clearInterval(pinger);
  const { error } = await l.closed;
  assert.equal(error.code, 'UNAVAILABLE');
});
