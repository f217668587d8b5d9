#!/usr/bin/env node
// The conformance agent of sdk/PROTOCOL.md ("The conformance agent"):
//
//   node examples/agent.mjs --hub ws://127.0.0.1:7700/ws [--hub ws://…/ws …]
//        [--name ts] [--token T] [--drain-timeout 5s]
//
// (also MESH_HUB, a comma-separated list, MESH_AGENT_NAME and MESH_TOKEN).
// It serves N.echo, N.sleep, N.aborted, N.fail and N.trace, logs one line
// to stderr when registered, and exits 0 after a clean shutdown on SIGTERM
// or SIGINT.

import { Agent, MeshError, createLogger } from '../src/index.js';
import { parseArgs, parseDuration } from './cli.mjs';

const usage = `usage: agent.mjs [--hub URL]... [--name N] [--token T] [--drain-timeout 5s] [--log-level info]`;

function parseAgentArgs(argv) {
  const { flags, args } = parseArgs(argv, {
    '--hub': { repeat: true },
    '--name': {},
    '--token': {},
    '--drain-timeout': {},
    '--log-level': {},
    '--help': { bool: true },
    '-h': { alias: '--help' },
  });
  if (flags['--help']) {
    process.stdout.write(usage + '\n');
    process.exit(0);
  }
  if (args.length > 0) throw new Error(`unexpected argument ${args[0]}`);
  return {
    hubs: (flags['--hub'] ?? []).flatMap((h) => h.split(',')).filter(Boolean),
    name: flags['--name'],
    token: flags['--token'],
    drain: flags['--drain-timeout'] === undefined ? undefined : parseDuration(flags['--drain-timeout']),
    logLevel: flags['--log-level'] ?? 'info',
  };
}

let args;
try {
  args = parseAgentArgs(process.argv.slice(2));
} catch (e) {
  process.stderr.write(`agent.mjs: ${e.message}\n${usage}\n`);
  process.exit(2);
}

const env = process.env;
const hubs = args.hubs.length > 0 ? args.hubs : env.MESH_HUB ? env.MESH_HUB.split(',') : ['ws://127.0.0.1:7700/ws'];
const name = args.name ?? (env.MESH_AGENT_NAME || 'ts');
const token = args.token ?? (env.MESH_TOKEN || undefined);
const log = createLogger({ level: args.logLevel });

const agent = new Agent({ name, hubs, token, drainTimeoutMs: args.drain ?? 5000, logger: log });

// key -> {aborted, reason}: what each N.sleep saw.
const sleeps = new Map();

agent.handle(`${name}.echo`, (params) => params);

agent.handle(`${name}.sleep`, (params, ctx) => {
  const ms = Number(params?.ms ?? 0);
  const key = params?.key === undefined ? undefined : String(params.key);
  if (key !== undefined) sleeps.set(key, { aborted: false, reason: '' });
  return new Promise((resolve, reject) => {
    const onAbort = () => {
      clearTimeout(t);
      const reason = ctx.signal.reason;
      if (key !== undefined) sleeps.set(key, { aborted: true, reason: reason instanceof MeshError ? `${reason.code}: ${reason.message}` : String(reason) });
      reject(reason);
    };
    const t = setTimeout(() => {
      ctx.signal.removeEventListener('abort', onAbort);
      resolve({ slept: ms });
    }, ms);
    if (ctx.signal.aborted) onAbort();
    else ctx.signal.addEventListener('abort', onAbort, { once: true });
  });
});

agent.handle(`${name}.aborted`, (params) => {
  const s = sleeps.get(String(params?.key));
  return { aborted: s?.aborted ?? false, reason: s?.reason ?? '' };
});

agent.handle(`${name}.fail`, (params) => {
  throw new Error(typeof params?.message === 'string' ? params.message : 'fail');
});

agent.handle(`${name}.trace`, (_params, ctx) => ({ traceparent: ctx.traceparent, tracestate: ctx.tracestate }));

agent.on('registered', ({ agentId, hub }) => {
  process.stderr.write(`registered as ${agentId} with ${hub}\n`);
});

try {
  await agent.runUntilSignal();
  log.info('stopped');
} catch (e) {
  process.stderr.write(`agent.mjs: ${e.message}\n`);
  process.exit(1);
}
