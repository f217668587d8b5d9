import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { test } from 'node:test';

import { REDIAL_INITIAL_MS, REDIAL_MAX_MS, REDIAL_MIN_MS, Redial, SDK_VERSION, spreadDelay } from '../src/index.js';

test('Redial: full jitter in [100 ms, ceiling]; ceiling 1 s for four tries, then ×1.5 up to 5 s', () => {
  assert.equal(REDIAL_MIN_MS, 100);
  assert.equal(REDIAL_INITIAL_MS, 1000);
  assert.equal(REDIAL_MAX_MS, 5000);
  const ceilings = [1000, 1000, 1000, 1000, 1500, 2250, 3375, 5000, 5000, 5000];
  const lo = new Redial(() => 0);
  const hi = new Redial(() => 1 - Number.EPSILON);
  for (const c of ceilings) {
    assert.equal(lo.next(), 100);
    const h = hi.next();
    assert.ok(Math.abs(h - c) < 1e-6, `ceiling ${c}, got ${h}`);
  }
  hi.reset();
  assert.ok(hi.next() <= 1000);
});

test('Redial: random draws stay within bounds and spread', () => {
  const r = new Redial();
  const first = [];
  for (let i = 0; i < 4; i++) first.push(r.next());
  for (const d of first) assert.ok(d >= 100 && d <= 1000, `first delays in [100, 1000]: ${d}`);
  for (let i = 0; i < 50; i++) {
    const d = r.next();
    assert.ok(d >= 100 && d <= 5000, `in [100, 5000]: ${d}`);
  }
  const many = Array.from({ length: 200 }, () => new Redial().next());
  assert.ok(Math.min(...many) < 300 && Math.max(...many) > 800, 'jittered over the whole range');
});

test('spreadDelay: uniform [0, min(2 s, interval))', () => {
  assert.equal(spreadDelay(5000, () => 0), 0);
  assert.ok(Math.abs(spreadDelay(5000, () => 0.999999) - 2000) < 0.01);
  assert.ok(Math.abs(spreadDelay(500, () => 0.999999) - 500) < 0.01);
  assert.ok(Math.abs(spreadDelay(0, () => 0.5) - 1000) < 1e-9, 'no interval yet: 2 s bound');
  for (let i = 0; i < 100; i++) {
    const d = spreadDelay(300);
    assert.ok(d >= 0 && d < 300);
  }
});

test('SDK_VERSION is package.json\'s', () => {
  const pkg = JSON.parse(readFileSync(new URL('../package.json', import.meta.url), 'utf8'));
  assert.equal(SDK_VERSION, pkg.version);
});
