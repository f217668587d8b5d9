#!/usr/bin/env node
// Calls one method through a hub and prints its result as one JSON line:
//
//   node examples/client.mjs [--hub URL] [--timeout 5s] [--traceparent TP] [--token T] METHOD [PARAMS_JSON]
//
// (also MESH_HUB and MESH_TOKEN). Exit 0 with the result on stdout; on an
// error, {"error":{"code":…,"message":…}} on stdout and exit 1; exit 2 on a
// bad command line.

import { Client, MeshError } from '../src/index.js';
import { parseArgs, parseDuration } from './cli.mjs';

const usage = 'usage: client.mjs [--hub URL] [--timeout 5s] [--traceparent TP] [--tracestate TS] [--token T] METHOD [PARAMS_JSON]';

let opts;
try {
  const { flags, args } = parseArgs(process.argv.slice(2), {
    '--hub': { repeat: true },
    '--timeout': {},
    '--traceparent': {},
    '--tracestate': {},
    '--token': {},
    '--help': { bool: true },
    '-h': { alias: '--help' },
  });
  if (flags['--help']) {
    process.stdout.write(usage + '\n');
    process.exit(0);
  }
  if (args.length < 1 || args.length > 2) throw new Error('want METHOD and at most one PARAMS_JSON');
  let params;
  if (args.length === 2) {
    try {
      params = JSON.parse(args[1]);
    } catch (e) {
      throw new Error(`PARAMS_JSON is not JSON: ${e.message}`);
    }
  }
  const env = process.env;
  opts = {
    hubs: flags['--hub'] ?? (env.MESH_HUB ? env.MESH_HUB.split(',') : undefined),
    timeoutMs: flags['--timeout'] === undefined ? 10000 : parseDuration(flags['--timeout']),
    traceparent: flags['--traceparent'],
    tracestate: flags['--tracestate'],
    token: flags['--token'] ?? (env.MESH_TOKEN || undefined),
    method: args[0],
    params,
  };
} catch (e) {
  process.stderr.write(`client.mjs: ${e.message}\n${usage}\n`);
  process.exit(2);
}

const client = new Client({ hubs: opts.hubs, token: opts.token, timeoutMs: opts.timeoutMs });
let code = 0;
try {
  const result = await client.call(opts.method, opts.params, { traceparent: opts.traceparent, tracestate: opts.tracestate });
  process.stdout.write(JSON.stringify(result ?? null) + '\n');
} catch (e) {
  const err = e instanceof MeshError ? { code: e.code, message: e.message } : { code: 'INTERNAL_ERROR', message: String(e?.message ?? e) };
  if (e instanceof MeshError && e.details !== undefined) err.details = e.details;
  process.stdout.write(JSON.stringify({ error: err }) + '\n');
  code = 1;
} finally {
  await client.close();
}
process.exitCode = code;
