"""What a command prints for a person: timestamped progress lines and JSON-ready config values."""

from __future__ import annotations

import time
from pathlib import Path


def jsonable(values: dict) -> dict:
    """A config's fields as JSON values (paths as strings, tuples as lists), comparable with a loaded report."""
    return {k: (str(v) if isinstance(v, Path) else list(v) if isinstance(v, tuple) else v) for k, v in values.items()}


def say(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)
