"""What a command prints for a person: timestamped progress lines and JSON-ready config values."""

from __future__ import annotations

import time
from pathlib import Path


def jsonable(values: dict) -> dict:
    """A config's fields as JSON values (paths as strings, tuples as lists, a nested config's as a dict of them),
    comparable with a loaded report."""
    return {k: _jsonable(v) for k, v in values.items()}


def _jsonable(value: object) -> object:
    if isinstance(value, dict):
        return jsonable(value)
    return str(value) if isinstance(value, Path) else list(value) if isinstance(value, tuple) else value


def say(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)
