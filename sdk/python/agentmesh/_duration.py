"""Go-style durations ("5s", "500ms", "1m30s") for command lines."""

from __future__ import annotations

import re
from typing import Final

_PART: Final = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(h|ms|us|µs|ns|m|s)")
_UNIT: Final = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "ns": 1e-9}


def parse_duration(text: str) -> float:
    """A Go-style duration in seconds: "5s", "500ms", "1m30s", "1.5s"; a
    bare number is seconds. Raises ValueError."""
    text = text.strip()
    try:
        v = float(text)
    except ValueError:
        pass
    else:
        if v < 0 or v != v:
            raise ValueError(f"invalid duration {text!r}")
        return v
    pos, total = 0, 0.0
    for m in _PART.finditer(text):
        if m.start() != pos:
            break
        total += float(m.group(1)) * _UNIT[m.group(2)]
        pos = m.end()
    if not text or pos != len(text):
        raise ValueError(f"invalid duration {text!r}")
    return total
