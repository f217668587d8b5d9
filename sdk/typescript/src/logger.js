// A small logger writing one line per entry to stderr, for the examples
// and for agents that want one: "2025-01-01T00:00:00.000Z INFO registered hub=ws://…".

const LEVELS = { debug: 10, info: 20, warn: 30, error: 40 };

function fmt(v) {
  if (typeof v === 'string') return /[\s"=]/.test(v) || v === '' ? JSON.stringify(v) : v;
  if (v instanceof Error) return JSON.stringify(v.message);
  try {
    return JSON.stringify(v);
  } catch {
    return String(v);
  }
}

/**
 * A logger with debug, info, warn and error methods (message, fields)
 * writing to stream (process.stderr) the entries at level or above.
 */
export function createLogger({ level = 'info', stream = process.stderr } = {}) {
  const min = LEVELS[level] ?? LEVELS.info;
  const out = {};
  for (const [name, n] of Object.entries(LEVELS)) {
    out[name] =
      n < min
        ? () => {}
        : (msg, fields) => {
            let line = `${new Date().toISOString()} ${name.toUpperCase()} ${msg}`;
            if (fields) for (const [k, v] of Object.entries(fields)) if (v !== undefined) line += ` ${k}=${fmt(v)}`;
            stream.write(line + '\n');
          };
  }
  return Object.freeze(out);
}
