"""The faust worker's settings (`flywheel process`, processors.worker): its metrics port, its log level and whether
a supervisor restarts it.

A module of its own, free of faust, so that the runs that start workers (`flywheel demo`, `flywheel chaos`) hold it
in their config and derive the worker's command line from it (core.cli_config.config_argv). Where the worker reads
and writes (the broker, the topics, the tables) is the deployment's: core.settings.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class WorkerConfig:
    metrics_port: int = 0
    """/metrics port (0: any free port)."""
    loglevel: str = "warning"
    """faust's log level: debug, info, warning, error or critical."""
    restart: bool = True
    """Start the worker again after a crash (a batch it could not write, an object store or broker it could not
    reach): a supervisor runs it (--no-restart: the worker runs in this process)."""
    max_screenshot_bytes: int = 512 * 1024
    """A step with a larger screenshot is dead-lettered."""
    dedup_window_s: float = 3600.0
    """The sinks hold the identities (event_id, ...) of rows produced this recently in memory to drop repeats (an
    edge re-send, an episode re-emitted after a crash); older events are looked up in Delta instead. Memory: about
    140 bytes per step in the window (1000 steps/s for an hour: ~0.5 GB)."""
    abandon_after_s: float = 300.0
    """An open episode that gets no step while its steps partition's event time (the steps' produced_at, not the
    wall clock) moves on this many seconds is closed as abandoned (processors.assembly): emitted with its steps so
    far, never a success; a later step of it lands in `steps` and is counted as late."""
    maintenance_interval_s: float = 0.0
    """Seconds between the worker's Delta maintenance passes, in a thread of its own (0: off; `flywheel maintain`)."""

    def __post_init__(self) -> None:
        # `not 0 < x < inf`: NaN is refused too, and inf would hold every identity or open episode forever.
        for name in ("max_screenshot_bytes", "dedup_window_s", "abandon_after_s"):
            if not 0 < getattr(self, name) < float("inf"):
                raise ValueError(f"{name} must be a finite number > 0, not {getattr(self, name)}")
        if not 0 <= self.maintenance_interval_s < float("inf"):
            raise ValueError(f"maintenance_interval_s must be a finite number >= 0 (0: off), not "
                             f"{self.maintenance_interval_s}")  # fmt: skip
