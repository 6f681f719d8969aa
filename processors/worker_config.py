"""The faust worker's settings (`flywheel process`, processors.worker): its metrics port, its log level and whether
a supervisor restarts it.

A module of its own, free of faust, so that the runs that start workers (`flywheel demo`, `flywheel chaos`) hold it
in their config and derive the worker's command line from it (core.cli_config.config_argv). What the worker reads
and writes (topics, tables, maintenance) is the environment's: core.settings.
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
