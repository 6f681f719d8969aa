"""A local Prometheus for the demo and the tests, and reading it back (instant and range queries)."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import logging
import os
import re
import shutil
import signal
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path

from core.metrics import SCRAPE_WAIT_ENV, SD_DIR_ENV, write_sd_target
from core.processes import free_ports

log = logging.getLogger(__name__)


OPS_PROMETHEUS = Path(__file__).resolve().parents[2] / "ops" / "prometheus"
DEMO_SCRAPE_INTERVAL = "1s"  # short-lived processes live 10-60 s in the demo


# --- a local Prometheus ----------------------------------------------------------------------------------


def prometheus_binary() -> str | None:
    return shutil.which("prometheus")


def write_demo_config(workdir: Path, scrape_interval: str = DEMO_SCRAPE_INTERVAL) -> Path:
    """workdir/prometheus.yml + rules/: ops/prometheus with the intervals shortened. Relative paths in it
    (rules/, targets/) resolve against workdir, so the directory is self-contained and browsable later."""
    workdir.mkdir(parents=True, exist_ok=True)
    text = (OPS_PROMETHEUS / "prometheus.yml").read_text()
    text = re.sub(r"(?m)^(\s*(?:scrape|evaluation)_interval:)\s*\S+", rf"\1 {scrape_interval}", text)
    (workdir / "prometheus.yml").write_text(text)
    rules = workdir / "rules"
    rules.mkdir(exist_ok=True)
    for path in (OPS_PROMETHEUS / "rules").glob("*.yml"):
        shutil.copy(path, rules / path.name)
    (workdir / "targets").mkdir(exist_ok=True)
    return workdir / "prometheus.yml"


class Prometheus:
    """A Prometheus server in its own process group, bound to loopback."""

    def __init__(self, workdir: Path, port: int = 0, host: str = "127.0.0.1", retention: str = "15d"):
        binary = prometheus_binary()
        if binary is None:
            raise FileNotFoundError("prometheus is not installed (ops/setup.sh installs Debian's package)")
        self.workdir = workdir
        self.host = host
        self.port = port or free_ports(1, host)
        self.url = f"http://{host}:{self.port}"
        config = workdir / "prometheus.yml"
        self._log = open(workdir / "prometheus.log", "ab")
        self.proc = subprocess.Popen(
            [
                binary,
                f"--config.file={config}",
                f"--storage.tsdb.path={workdir / 'data'}",
                f"--storage.tsdb.retention.time={retention}",
                f"--web.listen-address={host}:{self.port}",
                "--web.enable-lifecycle",
            ],
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        # Prometheus scrapes itself: its target is a file like every other process's.
        write_sd_target(workdir / "targets" / "prometheus.json", f"{host}:{self.port}", {"job": "prometheus"})

    def wait_ready(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"prometheus exited ({self.proc.returncode}); see {self.workdir / 'prometheus.log'}")
            with contextlib.suppress(OSError):
                with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as response:
                    if response.status == 200:
                        return
            time.sleep(0.25)
        raise TimeoutError(f"prometheus not ready after {timeout:.0f} s")

    def stop(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        self._log.close()


@contextlib.contextmanager
def running_prometheus(workdir: Path, port: int = 0, host: str = "127.0.0.1") -> Iterator[Prometheus]:
    server = Prometheus(workdir, port, host)
    try:
        server.wait_ready()
        yield server
    finally:
        server.stop()


# --- reading Prometheus ------------------------------------------------------------------------------------


def query(url: str, expr: str, at: float | None = None, timeout: float = 5.0) -> list[dict]:
    """Instant query; the `result` list of the API's answer (raises on an error answer)."""
    params = {"query": expr}
    if at is not None:
        params["time"] = f"{at:.3f}"
    return _api(url, "query", params, timeout)


def query_range(url: str, expr: str, start: float, end: float, step: float, timeout: float = 15.0) -> list[dict]:
    params = {"query": expr, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": f"{step:g}"}
    return _api(url, "query_range", params, timeout)


def _api(url: str, endpoint: str, params: dict, timeout: float) -> list[dict]:
    data = urllib.parse.urlencode(params).encode()
    with urllib.request.urlopen(f"{url.rstrip('/')}/api/v1/{endpoint}", data=data, timeout=timeout) as response:
        answer = json.loads(response.read())
    if answer.get("status") != "success":
        raise RuntimeError(f"prometheus: {answer.get('error', answer)} for {params['query']!r}")
    return answer["data"]["result"]


# --- the demo's observability ----------------------------------------------------------------------------------


@dataclasses.dataclass
class DemoObservability:
    env: dict[str, str]
    """Variables for the children: where to announce their /metrics, how long to wait for a scrape."""
    workdir: Path
    """OUT/prometheus: config, rules, targets/, data/ (the run's TSDB)."""
    prometheus: Prometheus | None = None
    started_at: float = dataclasses.field(default_factory=time.time)

    @property
    def url(self) -> str | None:
        return self.prometheus.url if self.prometheus else None

    @property
    def query_range(self):
        """query_range(expr, start, end, step) against this run's Prometheus (None without one)."""
        return functools.partial(query_range, self.url) if self.url else None

    def report(self) -> dict:
        return {"prometheus_url": self.url, "prometheus_dir": str(self.workdir), "start": self.started_at,
                "end": time.time()}  # fmt: skip


@contextlib.contextmanager
def demo_observability(out: Path, enabled: bool = True, port: int = 0, host: str = "127.0.0.1"):
    """A Prometheus for one demo run under OUT/prometheus, scraping every 1 s, or nothing when it is
    turned off or not installed."""
    workdir = (out / "prometheus").resolve()
    if not enabled or prometheus_binary() is None:
        yield DemoObservability({}, workdir)
        return
    write_demo_config(workdir)
    for stale in (workdir / "targets").glob("*.json"):  # an earlier run's processes are gone
        stale.unlink()
    with running_prometheus(workdir, port, host) as server:
        env = {SD_DIR_ENV: str(workdir / "targets"), SCRAPE_WAIT_ENV: "10"}
        yield DemoObservability(env, workdir, server)
