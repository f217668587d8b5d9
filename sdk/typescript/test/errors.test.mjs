import assert from 'node:assert/strict';
import { test } from 'node:test';

import * as sdk from '../src/index.js';
import { CODES, MeshError, codeFromRpcCode } from '../src/index.js';

const table = {
  PARSE_ERROR: [-32700, false],
  INVALID_REQUEST: [-32600, false],
  METHOD_NOT_FOUND: [-32601, false],
  INVALID_PARAMS: [-32602, false],
  INTERNAL_ERROR: [-32603, false],
  RPC_ERROR: [-32000, false],
  AGENT_NOT_FOUND: [-32001, false],
  UNAVAILABLE: [-32002, true],
  TIMEOUT: [-32003, true], // idempotent calls only; the wire says true, as the Go envelope does
  CIRCUIT_OPEN: [-32004, true],
  OVERLOADED: [-32005, true],
  CANCELLED: [-32006, false],
  UNAUTHENTICATED: [-32007, false],
  PERMISSION_DENIED: [-32008, false],
};

test('every code of PROTOCOL.md is exported with its rpcCode and retry class', () => {
  assert.deepEqual(Object.keys(CODES).sort(), Object.keys(table).sort());
  for (const [code, [rpc, retryable]] of Object.entries(table)) {
    assert.equal(sdk[code], code, `constant ${code}`);
    assert.equal(sdk.ErrorCodes[code], code);
    assert.equal(CODES[code].rpcCode, rpc);
    assert.equal(codeFromRpcCode(rpc), code);
    const e = new MeshError(code, 'm');
    assert.equal(e.rpcCode, rpc);
    assert.equal(e.retryable, retryable, code);
  }
  assert.equal(CODES.TIMEOUT.retry, 'idempotent');
});

test('MeshError: an unknown code is RPC_ERROR; it is an Error', () => {
  const e = new MeshError('NOPE', 'x');
  assert.equal(e.code, 'RPC_ERROR');
  assert.equal(e.rpcCode, -32000);
  assert.ok(e instanceof Error);
  assert.equal(e.name, 'MeshError');
  assert.equal(e.message, 'x');
});

test('MeshError.fromWire: the symbolic code wins, then the number, else RPC_ERROR', () => {
  let e = MeshError.fromWire({ code: 'TIMEOUT', rpcCode: -32601, message: 'slow', retryable: true, notSent: true, details: { a: 1 } });
  assert.equal(e.code, 'TIMEOUT');
  assert.equal(e.rpcCode, -32003);
  assert.equal(e.message, 'slow');
  assert.equal(e.notSent, true);
  assert.deepEqual(e.details, { a: 1 });
  e = MeshError.fromWire({ code: 'SOMETHING_NEW', rpcCode: -32005, message: 'm' });
  assert.equal(e.code, 'OVERLOADED');
  e = MeshError.fromWire({ code: 'SOMETHING_NEW', message: 'm' });
  assert.equal(e.code, 'RPC_ERROR');
  e = MeshError.fromWire({ code: -32601, message: 'jsonrpc style' });
  assert.equal(e.code, 'METHOD_NOT_FOUND');
  e = MeshError.fromWire('garbage');
  assert.equal(e.code, 'RPC_ERROR');
  assert.equal(MeshError.fromWire({ code: 'INTERNAL_ERROR' }).notSent, false);
});

test('MeshError.from: MeshError kept, any other throw is INTERNAL_ERROR with its message', () => {
  const m = new MeshError('INVALID_PARAMS', 'bad');
  assert.equal(MeshError.from(m), m);
  const e = MeshError.from(new TypeError('boom'));
  assert.equal(e.code, 'INTERNAL_ERROR');
  assert.equal(e.message, 'boom');
  assert.equal(MeshError.from('plain string').message, 'plain string');
  assert.equal(MeshError.from(42).code, 'INTERNAL_ERROR');
});

test('MeshError.toWire round-trips', () => {
  const e = new MeshError('OVERLOADED', 'full', { details: { retryAfterMs: 50 }, notSent: true });
  const w = JSON.parse(JSON.stringify(e));
  assert.deepEqual(w, { code: 'OVERLOADED', rpcCode: -32005, message: 'full', retryable: true, notSent: true, details: { retryAfterMs: 50 } });
  const back = MeshError.fromWire(w);
  assert.equal(back.code, 'OVERLOADED');
  assert.deepEqual(back.details, { retryAfterMs: 50 });
});
