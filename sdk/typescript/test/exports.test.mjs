import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { test } from 'node:test';

import * as sdk from '../src/index.js';

test('index.d.ts declares every runtime export, and nothing else', () => {
  const dts = readFileSync(new URL('../src/index.d.ts', import.meta.url), 'utf8');
  const declared = new Set();
  for (const m of dts.matchAll(/^export (?:declare )?(?:const|function|class|let) ([A-Za-z_$][\w$]*)/gm)) declared.add(m[1]);
  const runtime = new Set(Object.keys(sdk));
  assert.deepEqual([...runtime].filter((n) => !declared.has(n)).sort(), [], 'exported but not declared');
  assert.deepEqual([...declared].filter((n) => !runtime.has(n)).sort(), [], 'declared but not exported');
});

test('package.json: ESM, Node 20+, ws pinned, exports with types', () => {
  const pkg = JSON.parse(readFileSync(new URL('../package.json', import.meta.url), 'utf8'));
  assert.equal(pkg.type, 'module');
  assert.equal(pkg.engines.node, '>=20');
  assert.deepEqual(pkg.dependencies, { ws: '8.23.0' });
  assert.equal(pkg.exports['.'].types, './src/index.d.ts');
  assert.equal(pkg.exports['.'].default, './src/index.js');
});
