"""Observability plumbing: /metrics endpoints that Prometheus finds on their own, the consumer-lag exporter,
and a local Prometheus for the demo.

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
import contextlib
import dataclasses
import json
import logging
import os
import re
import shutil
import signal
import socket
import subprocess
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path

from prometheus_client import REGISTRY, start_http_server
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from flywheel.settings import Settings

log = logging.getLogger(__name__)

SD_DIR_ENV = "FLYWHEEL_METRICS_SD_DIR"
SCRAPE_WAIT_ENV = "FLYWHEEL_METRICS_SCRAPE_WAIT_S"
OPS_PROMETHEUS = Path(__file__).resolve().parent.parent / "ops" / "prometheus"
DEMO_SCRAPE_INTERVAL = "1s"  # short-lived processes live 10-60 s in the demo


# --- endpoints and file-based service discovery ---------------------------------------------------------


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


# --- consumer lag under kafka_exporter's names --------------------------------------------------------------


class LagExporter(Collector):
    """Broker and consumer-lag metrics, named as kafka_exporter names them so standard dashboards apply.

    The sinks do not use Kafka group commits for correctness: the offsets in the Delta commits are the
    truth (processors.delta_sink). So a sink's "committed offset" is the Delta-recorded last offset + 1,
    and lag = topic end offset - that. consumergroup = the sink (= the Delta table it writes).

    A thread polls every `interval` s (one ListOffsets request, one incremental Delta log read per
    table); a scrape only reads the last snapshot, so it never waits on Kafka.
    """

    def __init__(self, settings: Settings, interval: float = 2.0):
        from processors.tables import EPISODES, STEPS, TRAINING_SAMPLES
        from streams.topics import topics_for

        topics = topics_for(settings)
        self.settings = settings
        self.interval = interval
        self.sinks = {STEPS: topics.steps.name, EPISODES: topics.episodes.name, TRAINING_SAMPLES: topics.episodes.name}
        self.topics = [t.name for t in topics.all()]
        self.model_versions_topic = topics.model_versions.name
        self._families: list = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="lag-exporter", daemon=True)
        self._consumer = None
        self._tables: dict = {}
        self._latest_model: tuple[int, object] | None = None  # (offset, ModelVersionEvent)

    def start(self) -> LagExporter:
        REGISTRY.register(self)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(10)
        with contextlib.suppress(KeyError):
            REGISTRY.unregister(self)
        if self._consumer is not None:
            self._consumer.close()

    def collect(self):
        return iter(self._families)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self._families = self.poll()
            except Exception as error:  # noqa: BLE001 - a broker outage must not kill the worker
                log.warning("lag exporter: %s", error)
                up = GaugeMetricFamily("flywheel_kafka_up", "1 if the last broker poll succeeded")
                up.add_metric([], 0)
                self._families = [up]
                self._close_consumer()
            self._stop.wait(self.interval)

    def _close_consumer(self) -> None:
        if self._consumer is not None:
            with contextlib.suppress(Exception):
                self._consumer.close()
            self._consumer = None

    def poll(self) -> list:
        from kafka import TopicPartition

        from flywheel.kafka_clients import make_consumer

        if self._consumer is None:
            self._consumer = make_consumer(self.settings, "flywheel-lag-exporter")
        consumer = self._consumer
        partitions = []
        for topic in self.topics:
            for partition in sorted(consumer.partitions_for_topic(topic) or ()):
                partitions.append(TopicPartition(topic, partition))
        ends = consumer.end_offsets(partitions) if partitions else {}
        brokers = len(consumer._client.cluster.brokers())  # kafka-python keeps the cluster metadata here

        up = GaugeMetricFamily("flywheel_kafka_up", "1 if the last broker poll succeeded")
        up.add_metric([], 1)
        n_brokers = GaugeMetricFamily("kafka_brokers", "Number of brokers in the cluster")
        n_brokers.add_metric([], brokers)
        n_partitions = GaugeMetricFamily("kafka_topic_partitions", "Partitions of the topic", labels=["topic"])
        current = GaugeMetricFamily(
            "kafka_topic_partition_current_offset", "End offset of a partition", labels=["topic", "partition"]
        )
        for topic in self.topics:
            n_partitions.add_metric([topic], sum(1 for tp in ends if tp.topic == topic))
        for tp, end in sorted(ends.items()):
            current.add_metric([tp.topic, str(tp.partition)], end)

        group_labels = ["consumergroup", "topic", "partition"]
        group_offset = GaugeMetricFamily(
            "kafka_consumergroup_current_offset",
            "Next offset the sink will write: Delta-recorded last offset + 1",
            labels=group_labels,
        )
        lag = GaugeMetricFamily("kafka_consumergroup_lag", "End offset - sink offset", labels=group_labels)
        lag_sum = GaugeMetricFamily(
            "kafka_consumergroup_lag_sum", "Lag summed over partitions", labels=["consumergroup", "topic"]
        )
        for sink, topic in self.sinks.items():
            total = 0
            for tp in (tp for tp in ends if tp.topic == topic):
                next_offset = self._delta_offset(sink, topic, tp.partition) + 1
                behind = max(0, ends[tp] - next_offset)
                group_offset.add_metric([sink, topic, str(tp.partition)], next_offset)
                lag.add_metric([sink, topic, str(tp.partition)], behind)
                total += behind
            lag_sum.add_metric([sink, topic], total)
        return [up, n_brokers, n_partitions, current, group_offset, lag, lag_sum, *self._model_families(ends)]

    def _delta_offset(self, sink: str, topic: str, partition: int) -> int:
        """Last offset the sink recorded in Delta for this partition, -1 if none."""
        from deltalake import DeltaTable
        from deltalake.exceptions import TableNotFoundError

        from processors.delta_sink import app_id
        from processors.tables import table_uri

        dt = self._tables.get(sink)
        try:
            if dt is None:
                dt = self._tables[sink] = DeltaTable(table_uri(self.settings.tables_dir, sink))
            else:
                dt.update_incremental()
        except TableNotFoundError:
            return -1
        version = dt.transaction_version(app_id(sink, topic, partition))
        return -1 if version is None else version

    def _model_families(self, ends: dict) -> list:
        """The newest ModelVersionEvent (last record of the compacted topic): version in use, age, eval."""
        from kafka import TopicPartition

        from schemas import EventDecodeError, ModelVersionEvent, decode_event

        tp = TopicPartition(self.model_versions_topic, 0)
        end = ends.get(tp, 0)
        if end > 0 and (self._latest_model is None or self._latest_model[0] != end - 1):
            consumer = self._consumer
            consumer.assign([tp])
            consumer.seek(tp, end - 1)
            deadline = time.monotonic() + 5  # the first fetch after an assign can come back empty
            while time.monotonic() < deadline and (self._latest_model is None or self._latest_model[0] < end - 1):
                for record in consumer.poll(timeout_ms=500).get(tp, []):
                    with contextlib.suppress(EventDecodeError):
                        self._latest_model = (record.offset, decode_event(record.value, expect=ModelVersionEvent))
        info = GaugeMetricFamily(
            "flywheel_model_version_latest_info",
            "Newest published model version (value 1)",
            labels=["version", "channel"],
        )
        published = GaugeMetricFamily(
            "flywheel_model_version_latest_timestamp_seconds", "When the newest model version was published"
        )
        evals = GaugeMetricFamily(
            "flywheel_model_version_eval_success_ratio",
            "Eval success rate recorded in the newest model version's event",
            labels=["task", "model_version"],
        )
        if self._latest_model is not None:
            event = self._latest_model[1]
            info.add_metric([event.version, event.channel], 1)
            published.add_metric([], event.produced_at)
            for task, rate in sorted(event.eval.items()):
                evals.add_metric([task, event.version], rate)
        return [info, published, evals]


# --- a local Prometheus ----------------------------------------------------------------------------------


def prometheus_binary() -> str | None:
    return shutil.which("prometheus")


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


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
        self.port = port or free_port(host)
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
