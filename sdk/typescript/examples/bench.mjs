#!/usr/bin/env node
// A closed-loop load generator with the SDK's Client: -c workers each call
// METHOD back to back for -d, over one link; prints one JSON line
//
//   {"calls":N,"errors":E,"seconds":S,"callsPerSecond":R,"p50ms":…,"p99ms":…}
//
//   node examples/bench.mjs [--hub URL] [-c 16] [-d 10s] [--timeout 5s] [--token T] METHOD [PARAMS_JSON]

import { Client } from '../src/index.js';
import { parseArgs, parseDuration } from './cli.mjs';

const usage = 'usage: bench.mjs [--hub URL] [-c 16] [-d 10s] [--timeout 5s] [--token T] METHOD [PARAMS_JSON]';

let o;
try {
  const { flags, args } = parseArgs(process.argv.slice(2), {
    '--hub': { repeat: true },
    '--concurrency': {},
    '-c': { alias: '--concurrency' },
    '--duration': {},
    '-d': { alias: '--duration' },
    '--timeout': {},
    '--token': {},
    '--help': { bool: true },
    '-h': { alias: '--help' },
  });
  if (flags['--help']) {
    process.stdout.write(usage + '\n');
    process.exit(0);
  }
  if (args.length < 1 || args.length > 2) throw new Error('want METHOD and at most one PARAMS_JSON');
  const env = process.env;
  o = {
    hubs: flags['--hub'] ?? (env.MESH_HUB ? env.MESH_HUB.split(',') : undefined),
    concurrency: Number(flags['--concurrency'] ?? 16),
    durationMs: parseDuration(flags['--duration'] ?? '10s'),
    timeoutMs: parseDuration(flags['--timeout'] ?? '5s'),
    token: flags['--token'] ?? (env.MESH_TOKEN || undefined),
    method: args[0],
    params: args.length === 2 ? JSON.parse(args[1]) : undefined,
  };
  if (!(Number.isInteger(o.concurrency) && o.concurrency > 0)) throw new Error('-c must be a positive integer');
} catch (e) {
  process.stderr.write(`bench.mjs: ${e.message}\n${usage}\n`);
  process.exit(2);
}

const client = new Client({ hubs: o.hubs, token: o.token, timeoutMs: o.timeoutMs });
try {
  await client.call('mesh.ping', {}); // dial before the clock starts
} catch (e) {
  process.stderr.write(`bench.mjs: cannot reach the hub: ${e.message}\n`);
  await client.close();
  process.exit(1);
}

const latencies = [];
let errors = 0;
const firstErrors = new Map(); // code -> message
const start = performance.now();
const end = start + o.durationMs;

async function worker() {
  while (performance.now() < end) {
    const t0 = performance.now();
    try {
      await client.call(o.method, o.params);
      latencies.push(performance.now() - t0);
    } catch (e) {
      errors++;
      if (!firstErrors.has(e.code)) firstErrors.set(e.code, e.message);
      latencies.push(performance.now() - t0);
    }
  }
}

await Promise.all(Array.from({ length: o.concurrency }, worker));
const seconds = (performance.now() - start) / 1000;
await client.close();

latencies.sort((a, b) => a - b);
const pct = (p) => (latencies.length === 0 ? 0 : latencies[Math.min(latencies.length - 1, Math.ceil((p / 100) * latencies.length) - 1)]);
const round = (v, d = 3) => Math.round(v * 10 ** d) / 10 ** d;
for (const [code, msg] of firstErrors) process.stderr.write(`bench.mjs: ${code}: ${msg}\n`);
process.stdout.write(
  JSON.stringify({
    calls: latencies.length,
    errors,
    seconds: round(seconds),
    callsPerSecond: round(latencies.length / seconds, 1),
    p50ms: round(pct(50)),
    p99ms: round(pct(99)),
  }) + '\n',
);
