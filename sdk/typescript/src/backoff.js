// The redial schedule of PROTOCOL.md ("Lose the link"), as link.Redial
// in the Go SDK: full jitter, each delay uniform between 100 ms and a
// ceiling that stays at 1 s for the first four tries, then grows ×1.5 up
// to 5 s.

/** The shortest redial delay (ms). */
export const REDIAL_MIN_MS = 100;
/** The ceiling of the first four redial delays (ms). */
export const REDIAL_INITIAL_MS = 1000;
/** The largest ceiling (ms). */
export const REDIAL_MAX_MS = 5000;
/**
 * The bound of the first redial of a registered link lost while other hubs
 * are listed: uniform [0, min(REDIAL_SPREAD_MS, heartbeat interval)).
 */
export const REDIAL_SPREAD_MS = 2000;

/** Redial is the delay schedule of redials. The zero state is ready. */
export class Redial {
  /** @param {() => number} [random] uniform in [0, 1) (tests pass their own) */
  constructor(random = Math.random) {
    this.n = 0;
    this.random = random;
  }

  /** The ceiling of the next delay (ms), without consuming it. */
  ceiling() {
    let ceil = REDIAL_INITIAL_MS;
    for (let i = 4; i <= this.n && ceil < REDIAL_MAX_MS; i++) ceil *= 1.5;
    return Math.min(ceil, REDIAL_MAX_MS);
  }

  /** The next delay (ms). */
  next() {
    const ceil = this.ceiling();
    this.n++;
    return REDIAL_MIN_MS + this.random() * (ceil - REDIAL_MIN_MS);
  }

  /** Starts the schedule again (after a link was established). */
  reset() {
    this.n = 0;
  }
}

/**
 * The delay before dialling the next hub after a registered link was lost
 * while other hubs are listed: uniform [0, min(2 s, intervalMs)).
 */
export function spreadDelay(intervalMs, random = Math.random) {
  let spread = REDIAL_SPREAD_MS;
  if (intervalMs > 0 && intervalMs < spread) spread = intervalMs;
  return random() * spread;
}
