"""Rollout channels: which channel ("stable" or "canary") a client follows."""

from __future__ import annotations

import hashlib


def channel_for(client_id: str, canary_fraction: float) -> str:
    """A stable hash of the client id puts the same clients in the canary every time."""
    bucket = int(hashlib.sha256(client_id.encode()).hexdigest()[:8], 16) / 0xFFFFFFFF
    return "canary" if bucket < canary_fraction else "stable"
