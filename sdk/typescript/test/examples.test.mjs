// The examples as processes: the conformance agent (PROTOCOL.md) and the
// one-call client, against the fake hub.

import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { once } from 'node:events';
import { fileURLToPath } from 'node:url';
import { test as nodeTest } from 'node:test';

import { FakeHub, until } from '../testlib/fakehub.mjs';

const test = (name, fn) => nodeTest(name, { timeout: 15_000 }, fn);
const example = (name) => fileURLToPath(new URL(`../examples/${name}`, import.meta.url));

function run(t, script, args, env = {}) {
  const child = spawn(process.execPath, [example(script), ...args], { env: { ...process.env, MESH_HUB: '', MESH_TOKEN: '', MESH_AGENT_NAME: '', ...env }, stdio: ['ignore', 'pipe', 'pipe'] });
  child.out = '';
  child.err = '';
  child.stdout.on('data', (d) => (child.out += d));
  child.stderr.on('data', (d) => (child.err += d));
  child.exited = once(child, 'exit').then(([code, signal]) => ({ code, signal }));
  t.after(() => {
    if (child.exitCode === null && child.signalCode === null) child.kill('SIGKILL');
    return child.exited;
  });
  return child;
}

async function withHub(t, opts) {
  const hub = await FakeHub.start(opts);
  t.after(() => hub.close());
  return hub;
}

test('agent.mjs: registers as N, serves echo, sleep, aborted, fail and trace; drains and exits 0 on SIGTERM', async (t) => {
  const hub = await withHub(t, { heartbeatInterval: 0.2 });
  const child = run(t, 'agent.mjs', ['--hub', hub.url, '--name', 'tsx', '--token', 'tok', '--drain-timeout', '2s']);
  await until(() => /registered as \S+ with ws:\/\//.test(child.err), 5000, 'the registered line on stderr');
  const reg = hub.registrations[0].params;
  assert.equal(reg.name, 'tsx');
  assert.deepEqual(reg.capabilities, ['tsx.aborted', 'tsx.echo', 'tsx.fail', 'tsx.sleep', 'tsx.trace']);
  assert.equal(hub.conns[0].headers.authorization, 'Bearer tok');
  const conn = hub.conns[0];

  assert.deepEqual((await conn.call('tsx.echo', { a: [1, 'b'] }).answer).result, { a: [1, 'b'] });
  assert.deepEqual((await conn.call('tsx.sleep', { ms: 30, key: 'k1' }).answer).result, { slept: 30 });
  assert.deepEqual((await conn.call('tsx.aborted', { key: 'k1' }).answer).result, { aborted: false, reason: '' });

  const { seq, answer } = conn.call('tsx.sleep', { ms: 5000, key: 'k2' });
  await new Promise((r) => setTimeout(r, 50));
  conn.send({ type: 'cancel', seq });
  assert.equal((await answer).error.code, 'CANCELLED');
  const ab = (await conn.call('tsx.aborted', { key: 'k2' }).answer).result;
  assert.equal(ab.aborted, true);
  assert.match(ab.reason, /CANCELLED/);

  const ttl = await conn.call('tsx.sleep', { ms: 5000, key: 'k3' }, { headers: { ttl: 100 } }).answer;
  assert.equal(ttl.error.code, 'TIMEOUT');
  assert.match((await conn.call('tsx.aborted', { key: 'k3' }).answer).result.reason, /TIMEOUT/);

  const fail = (await conn.call('tsx.fail', { message: 'kaboom' }).answer).error;
  assert.equal(fail.code, 'INTERNAL_ERROR');
  assert.equal(fail.message, 'kaboom');

  const tp = '00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01';
  assert.deepEqual((await conn.call('tsx.trace', {}, { headers: { traceparent: tp, tracestate: 'x=y' } }).answer).result, { traceparent: tp, tracestate: 'x=y' });

  // SIGTERM during a sleep: deregistered, the sleep answered, exit 0.
  const slow = conn.call('tsx.sleep', { ms: 300, key: 'k4' });
  await new Promise((r) => setTimeout(r, 50));
  child.kill('SIGTERM');
  assert.deepEqual((await slow.answer).result, { slept: 300 });
  assert.equal((await child.exited).code, 0, child.err);
  const frames = conn.frames;
  const dereg = frames.findIndex((f) => f.method === 'agent.deregister');
  const ans = frames.findIndex((f) => f.type === 'res' && f.seq === slow.seq);
  assert.ok(dereg >= 0 && dereg < ans, 'deregistered before the answer');
  assert.equal((await conn.closed).code, 1000);
});

test('agent.mjs: MESH_HUB, MESH_AGENT_NAME and MESH_TOKEN; SIGINT exits 0', async (t) => {
  const a = await withHub(t);
  const child = run(t, 'agent.mjs', [], { MESH_HUB: `${a.url},ws://127.0.0.1:1/ws`, MESH_AGENT_NAME: 'envy', MESH_TOKEN: 'envtok' });
  await until(() => /registered as/.test(child.err), 5000, 'registered');
  assert.equal(a.registrations[0].params.name, 'envy');
  assert.equal(a.conns[0].headers.authorization, 'Bearer envtok');
  child.kill('SIGINT');
  assert.equal((await child.exited).code, 0, child.err);
});

test('client.mjs: prints the result as one JSON line; an error as {"error":…} with exit 1', async (t) => {
  const hub = await withHub(t, {
    handlers: {
      'echo.echo': (p, f) => ({ result: { params: p, traceparent: f.headers?.traceparent ?? null, ttl: f.headers?.ttl ?? null } }),
      'x.fail': () => ({ error: { code: 'INTERNAL_ERROR', rpcCode: -32603, message: 'boom' } }),
      'slow.op': () => null,
    },
  });
  const tp = '00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01';
  let c = run(t, 'client.mjs', ['--hub', hub.url, '--traceparent', tp, '--timeout', '3s', 'echo.echo', '{"a":1}']);
  assert.equal((await c.exited).code, 0, c.err);
  const out = JSON.parse(c.out);
  assert.equal(c.out.trim().split('\n').length, 1);
  assert.deepEqual(out.params, { a: 1 });
  assert.equal(out.traceparent, tp);
  assert.ok(out.ttl > 2000 && out.ttl <= 3000);

  c = run(t, 'client.mjs', ['--hub', hub.url, 'x.fail']);
  assert.equal((await c.exited).code, 1);
  assert.deepEqual(JSON.parse(c.out), { error: { code: 'INTERNAL_ERROR', message: 'boom' } });

  c = run(t, 'client.mjs', ['--hub', hub.url, '--timeout', '100ms', 'slow.op']);
  assert.equal((await c.exited).code, 1);
  assert.equal(JSON.parse(c.out).error.code, 'TIMEOUT');

  c = run(t, 'client.mjs', ['--hub', hub.url]);
  assert.equal((await c.exited).code, 2, 'usage error');
});
