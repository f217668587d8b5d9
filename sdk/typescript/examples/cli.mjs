// Helpers shared by the examples' command lines.

/** Parses a Go-style duration ("5s", "500ms", "1m30s", "1.5s"; a bare number is ms) into ms. */
export function parseDuration(s) {
  if (/^\d+(\.\d+)?$/.test(s)) return Number(s);
  const re = /(\d+(?:\.\d+)?)(ms|us|µs|ns|s|m|h)/gy;
  const unit = { h: 3600e3, m: 60e3, s: 1e3, ms: 1, us: 1e-3, µs: 1e-3, ns: 1e-6 };
  let total = 0;
  let end = 0;
  let m;
  while ((m = re.exec(s)) !== null) {
    total += Number(m[1]) * unit[m[2]];
    end = re.lastIndex;
  }
  if (s === '' || end !== s.length) throw new Error(`bad duration "${s}"`);
  return total;
}

/**
 * Parses argv against spec: {"--hub": {repeat: true}, "-c": {alias: "--concurrency"}, "--flag": {bool: true}, …}.
 * Returns {flags: {"--hub": [...], "--name": "x", …}, args: [positional…]}.
 * "--x=v" and "--x v" both work; "--" ends the flags.
 */
export function parseArgs(argv, spec) {
  const flags = {};
  const args = [];
  for (let i = 0; i < argv.length; i++) {
    let a = argv[i];
    if (a === '--') {
      args.push(...argv.slice(i + 1));
      break;
    }
    if (!a.startsWith('-') || a === '-') {
      args.push(a);
      continue;
    }
    let v;
    const eq = a.indexOf('=');
    if (eq > 0) {
      v = a.slice(eq + 1);
      a = a.slice(0, eq);
    }
    let s = spec[a];
    if (s?.alias) {
      a = s.alias;
      s = spec[a];
    }
    if (!s) throw new Error(`unknown flag ${a}`);
    if (s.bool) {
      flags[a] = v === undefined ? true : v !== 'false';
      continue;
    }
    if (v === undefined) {
      if (i + 1 >= argv.length) throw new Error(`${a} needs a value`);
      v = argv[++i];
    }
    if (s.repeat) (flags[a] ??= []).push(v);
    else flags[a] = v;
  }
  return { flags, args };
}
