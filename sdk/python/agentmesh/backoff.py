"""The redial schedule of PROTOCOL.md (the Go SDK's ``link.Redial``)."""

from __future__ import annotations

import random
from typing import Final

__all__ = ["Redial", "REDIAL_MIN", "REDIAL_INITIAL", "REDIAL_MAX", "REDIAL_SPREAD", "lost_delay"]

#: Floor of every redial delay (seconds).
REDIAL_MIN: Final = 0.1
#: The ceiling of the first four delays (seconds).
REDIAL_INITIAL: Final = 1.0
#: The highest ceiling (seconds).
REDIAL_MAX: Final = 5.0
#: Bound of the delay before a registered link lost while other hubs are
#: listed moves to the next hub (seconds).
REDIAL_SPREAD: Final = 2.0


class Redial:
    """Full jitter: each delay is uniform between 100 ms and a ceiling that
    stays at 1 s for the first four tries, then grows x1.5 up to 5 s.
    Not safe for concurrent use (one per run loop)."""

    def __init__(self, rng: random.Random | None = None) -> None:
        self._n = 0
        self._rng = rng or random.Random()

    def ceiling(self) -> float:
        """The ceiling of the next delay."""
        ceil = REDIAL_INITIAL
        i = 4
        while i <= self._n and ceil < REDIAL_MAX:
            ceil *= 1.5
            i += 1
        return min(ceil, REDIAL_MAX)

    def next(self) -> float:
        """The next delay, in seconds."""
        ceil = self.ceiling()
        self._n += 1
        return REDIAL_MIN + self._rng.random() * (ceil - REDIAL_MIN)

    def reset(self) -> None:
        """Starts the schedule again (after a link was established)."""
        self._n = 0


def lost_delay(heartbeat_interval: float | None = None, rng: random.Random | None = None) -> float:
    """The delay before a registered link that was lost while other hubs
    are listed dials the next one: uniform in [0, min(2 s, interval))."""
    spread = REDIAL_SPREAD
    if heartbeat_interval is not None and 0 < heartbeat_interval < spread:
        spread = heartbeat_interval
    return (rng or random).random() * spread
