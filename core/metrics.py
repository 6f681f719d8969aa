"""The /metrics endpoint of every process, announced for Prometheus' file-based service discovery.


How Prometheus finds processes whose ports are dynamic (file-based service discovery):
every process serves /metrics on a free port (`serve_metrics`); when the launcher sets
`FLYWHEEL_METRICS_SD_DIR`, the process also writes `<dir>/<job>-<pid>.json`
(`[{"targets": ["127.0.0.1:PORT"], "labels": {"job": ..., ...}}]`, written atomically) and removes it
when it exits. ops/prometheus/prometheus.yml reads `targets/*.json` with `file_sd_configs`.

Short-lived processes (an edge client per turn, a learner run) would lose what happened before their
first scrape and after their last one. With `FLYWHEEL_METRICS_SCRAPE_WAIT_S` > 0 (the demo sets it)
they wait, at most that long, for one scrape before they start working (`await_scrape`) and for one
more at exit, so Prometheus sees every counter from 0 to its final value. Discovery of a new file takes
up to ~5 s (Prometheus batches target updates every 5 s), which bounds the wait. Without the
variables, nothing waits and no files are written (a production fleet's discovery is its own).

Both variables are the launcher -> child protocol, so they are read here and nowhere else.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import time
from pathlib import Path

from prometheus_client import REGISTRY, start_http_server
from prometheus_client.registry import Collector

log = logging.getLogger(__name__)

SD_DIR_ENV = "FLYWHEEL_METRICS_SD_DIR"
SCRAPE_WAIT_ENV = "FLYWHEEL_METRICS_SCRAPE_WAIT_S"


class _ScrapeClock(Collector):
    """Yields no metrics; remembers when the registry was last collected, i.e. scraped."""

    def __init__(self) -> None:
        self.last = 0.0

    def collect(self):
        self.last = time.monotonic()
        return iter(())


_clock: _ScrapeClock | None = None
_sd_file: Path | None = None


def serve_metrics(job: str, host: str, port: int = 0, **labels: str) -> int:
    """Serve /metrics on host:port (0: a free port), announce it for file-based discovery when the
    launcher asked for it, and return the port."""
    global _clock, _sd_file
    server, _ = start_http_server(port, addr=host)
    port = server.server_port
    if _clock is None:
        _clock = _ScrapeClock()
        REGISTRY.register(_clock)
    sd_dir = os.environ.get(SD_DIR_ENV)
    if sd_dir:
        _sd_file = Path(sd_dir) / f"{job}-{os.getpid()}.json"
        write_sd_target(_sd_file, f"{host}:{port}", {"job": job, **labels})
        atexit.register(_at_exit)
    log.warning("%s /metrics on %s:%d", job, host, port)
    return port


def write_sd_target(path: Path, target: str, labels: dict[str, str]) -> None:
    """One file_sd target file, written to a temporary name and renamed (Prometheus never reads half a file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps([{"targets": [target], "labels": labels}]))
    tmp.replace(path)


def await_scrape(timeout: float | None = None) -> bool:
    """Wait until Prometheus has scraped this process after now (at most `timeout`, by default the
    launcher's FLYWHEEL_METRICS_SCRAPE_WAIT_S; 0 or no discovery: return at once). True if scraped."""
    if timeout is None:
        timeout = float(os.environ.get(SCRAPE_WAIT_ENV, "0") or 0)
    if _clock is None or _sd_file is None or timeout <= 0:
        return False
    since = time.monotonic()
    while _clock.last <= since:
        if time.monotonic() - since > timeout:
            return False
        time.sleep(0.05)
    return True


def _at_exit() -> None:
    await_scrape()  # final values
    if _sd_file is not None:
        _sd_file.unlink(missing_ok=True)
