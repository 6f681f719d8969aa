"""`flywheel bench pipeline --events N --out DIR`: the pipeline's capacity and latency, beside a baseline.

Two consumers of the same steps, each on its own fresh topics and tables, one after the other, once per round
(`--rounds`, alternating order; the figures are medians over the rounds, each round kept in the JSON):

* `worker`: the real worker (`flywheel process`): steps -> Delta `steps` with de-duplication, plus episode
  assembly, scoring, the episodes topic and the `episodes` / `training_samples` tables.
* `bare_consumer`: a plain kafka-python consumer (`flywheel bench bare-consumer`) appending the same
  batches (same size/age rule) to Delta through the same DeltaSink (same offsets-in-the-commit scheme),
  so the difference is what the rest of the pipeline costs.

Each runs two phases on realistic steps (160x210 PNG screens drawn like MiniWoB tasks, ~5 KB, as the
edge clients send them):

1. capacity: N steps are produced while the consumer is stopped, then it starts and drains the
   backlog; events/s = rows committed between its first and last commit / that time.
2. latency: with the consumer running, N steps are produced at a fixed offered rate (`--rate`);
   end-to-end latency per step = when the Delta commit holding its row became visible (the commit
   file's mtime) - `produced_at` in the event.

Lost (produced and acknowledged, never in Delta) and duplicated (rows beyond one per event_id) are
counted over both phases. Writes DIR/pipeline_bench.json and prints a table.

With `--kdi-binary PATH`, kafka-delta-ingest (flywheel.bench.kdi) runs the same two phases on the same steps as JSON.
With `--s3-data-dir s3://bucket/prefix` a third run, `worker_s3`, is the same worker with its tables on the object store
(the local S3Proxy, started for it): its events/s against `worker`'s on local disk, side by side. A commit's
visibility there is its log object's write time, read from S3Proxy's filesystem backend (S3's LastModified has
whole seconds only).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import statistics
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote

import pyarrow.parquet as pq
from kafka import TopicPartition

from core.cli_config import ConfigError
from core.machine import machine
from core.object_store import Location, is_remote, split_uri
from core.processes import Child
from core.settings import Settings
from core.stats import percentile
from flywheel.bench import kdi
from flywheel.bench.synthetic import bench_step, render_screens
from flywheel.run.stack import LocalStack, local_stack
from lake import s3proxy
from lake.tables import STEPS, open_table, table_exists, table_uri
from schemas import StepEvent, encode_event
from streams.kafka_clients import make_consumer, make_producer
from streams.topics import topics_for

log = logging.getLogger(__name__)
MODES = ("worker", "bare_consumer")


@dataclass(frozen=True)
class BenchConfig:
    out: Path
    """Where the report, each mode's tables (out/data) and logs go."""
    events: int = 20_000
    """Steps per phase (backlog drain, offered load) and mode."""
    rate: float = 1000.0
    """Offered steps/s in the latency phase."""
    steps_per_episode: int = 5
    """Steps of each synthetic episode (the last one ends it)."""
    client_steps_per_s: float = 10.0
    """One edge client's step rate, for the fleet-size statement."""
    timeout_s: float = 300.0
    """Per phase: give up waiting for rows after this long without progress."""
    rounds: int = 3
    """Every mode once per round, in alternating order; events/s and latencies are medians over the rounds (this
    shared VM's speed drifts by tens of percent between minutes), lost and duplicated add up."""
    s3_data_dir: str = ""
    """An s3://bucket/prefix: also run the worker with its tables there (`worker_s3`); empty: local only."""
    kdi_binary: str = ""
    """kafka-delta-ingest's executable, built by hand (flywheel.bench.kdi): also run it on the same steps as JSON
    (`kdi`); empty: not run."""

    def __post_init__(self) -> None:
        if self.rounds < 1:
            raise ValueError(f"--rounds {self.rounds}: at least 1")
        if self.kdi_binary and not (os.path.isfile(self.kdi_binary) and os.access(self.kdi_binary, os.X_OK)):
            raise ValueError(f"--kdi-binary {self.kdi_binary!r} is not an executable file")


@dataclass
class Produced:
    event_ids: list[str]
    wall_s: float
    payload_bytes: int

    @property
    def events_per_s(self) -> float:
        return len(self.event_ids) / self.wall_s if self.wall_s else 0.0


def produce_steps(
    settings: Settings,
    screens: list[bytes],
    count: int,
    client: str,
    steps_per_episode: int,
    rate: float = 0.0,
    encode: Callable[[StepEvent], bytes] = encode_event,
) -> Produced:
    """Send `count` steps (whole episodes) to the steps topic, paced at `rate` steps/s (0: unpaced), each as
    `encode` writes it; return the ids Kafka acknowledged."""
    producer = make_producer(settings, f"bench-{client}")
    topic = topics_for(settings).steps.name
    futures, payload = [], 0
    started = time.monotonic()
    try:
        for i in range(count):
            if rate > 0 and i % 10 == 0:  # pace in small bursts: sleep until the i-th step is due
                delay = started + i / rate - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
            episode, step = divmod(i, steps_per_episode)
            event = bench_step(screens, client, episode, step, steps_per_episode)
            value = encode(event)
            payload += len(value)
            futures.append((event.event_id, producer.send(topic, key=event.episode_id.encode(), value=value)))
        producer.flush()
    finally:
        producer.close()
    wall = time.monotonic() - started
    acked = [event_id for event_id, future in futures if future.succeeded()]
    if len(acked) != count:
        log.warning("%d of %d sends were not acknowledged", count - len(acked), count)
    return Produced(acked, wall, payload)


# --- when rows became visible: the Delta log ---------------------------------------------------------------------


def visible_rows(settings: Settings) -> dict[str, list[tuple[float, float]]]:
    """event_id -> [(visible_at, produced_at)] for each row of `steps`: visible_at is the mtime of the
    commit file that added the row's data file (the commit is atomic: that is when readers see it). A table on the
    local S3Proxy is read from its filesystem backend, where an object's file is written when it is put."""
    uri = Path(table_uri(settings.tables_dir, STEPS))
    if settings.data_is_remote:
        if not settings.uses_local_objectstore and settings.s3_endpoint != settings.local_s3_endpoint:
            raise ValueError("commit times on an external object store are not measured: use the local S3Proxy")
        bucket, key = split_uri(table_uri(settings.tables_dir, STEPS))
        uri = s3proxy.data_path(settings) / bucket / key
    rows: dict[str, list[tuple[float, float]]] = {}
    for commit in sorted((uri / "_delta_log").glob("*.json")):
        visible_at = commit.stat().st_mtime_ns / 1e9
        for line in commit.read_text().splitlines():
            action = json.loads(line)
            if "add" not in action:
                continue
            data = pq.read_table(uri / unquote(action["add"]["path"]), columns=["event_id", "produced_at"])
            for event_id, produced_at in zip(
                data.column("event_id").to_pylist(), data.column("produced_at").to_pylist(), strict=True
            ):
                rows.setdefault(event_id, []).append((visible_at, produced_at))
    return rows


def rows_landed(tables_dir: Location, wanted: set[str]) -> int:

    uri = table_uri(tables_dir, STEPS)
    if not table_exists(uri):
        return 0
    ids = open_table(uri).to_pyarrow_table(columns=["event_id"]).column(0).to_pylist()
    return sum(1 for event_id in ids if event_id in wanted)


def wait_for_rows(tables_dir: Location, wanted: set[str], consumer: Child, stall_s: float) -> None:
    """Until every wanted row is in Delta, or nothing new has landed for `stall_s` seconds."""
    last, last_change = -1, time.monotonic()
    while True:
        if not consumer.running():
            raise RuntimeError(f"{consumer.name} exited:\n{consumer.tail()}")
        landed = rows_landed(tables_dir, wanted)
        if landed >= len(wanted):
            return
        if landed != last:
            last, last_change = landed, time.monotonic()
        elif time.monotonic() - last_change > stall_s:
            log.warning("%s: %d of %d rows after %.0f s without progress", consumer.name, landed, len(wanted), stall_s)
            return
        time.sleep(0.25)


def phase_stats(rows: dict[str, list[tuple[float, float]]], event_ids: list[str]) -> dict:
    """Lost, duplicated, drain rate and latency of one phase's events."""
    landed = [rows[e] for e in event_ids if e in rows]
    latencies = [min(v for v, _ in copies) - copies[0][1] for copies in landed]
    commits = Counter(min(v for v, _ in copies) for copies in landed)  # visible_at -> rows that commit made visible
    times = sorted(commits)
    # Rate between the first and the last commit: the rows of the first commit were read before the clock starts.
    drained = sum(commits.values()) - (commits[times[0]] if times else 0)
    span = times[-1] - times[0] if len(times) > 1 else 0.0
    return {
        "events": len(event_ids),
        "landed": len(landed),
        "lost": len(event_ids) - len(landed),
        "duplicated": sum(len(copies) - 1 for copies in landed),
        "commits": len(times),
        "drain_events_per_s": round(drained / span, 1) if span else 0.0,
        "e2e_p50_s": round(percentile(latencies, 50), 3) if latencies else None,
        "e2e_p99_s": round(percentile(latencies, 99), 3) if latencies else None,
        "e2e_max_s": round(max(latencies), 3) if latencies else None,
    }


# --- the two consumers --------------------------------------------------------------------------------------------


CONSUMER_ARGS = {"worker": ("process",), "bare_consumer": ("bench", "bare-consumer")}  # `flywheel <args>` of each
ENCODINGS = {"kdi": kdi.json_step}  # the modes whose consumer reads another encoding than the events' own


def run_bare_consumer(settings: Settings) -> None:
    """The baseline: a bare kafka-python consumer, no group, every steps partition assigned, resuming after the
    offsets in the Delta table; batches due by the worker's rule (processors.batching.batch_due)."""
    from processors.batching import batch_due
    from processors.delta_sink import DeltaSink
    from processors.messages import step_records
    from processors.worker import BATCH_EARLY, BATCH_EARLY_S, BATCH_MAX, BATCH_WITHIN_S
    from processors.worker_config import WorkerConfig  # the worker's bound, so both modes dead-letter alike

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    topic = topics_for(settings).steps.name
    sink = DeltaSink(settings.tables_dir, STEPS)
    consumer = make_consumer(settings, "flywheel-bench-bare", fetch_max_bytes=64 * 1024 * 1024)
    while not (partition_ids := consumer.partitions_for_topic(topic)):
        time.sleep(0.2)
    partitions = [TopicPartition(topic, p) for p in sorted(partition_ids)]
    consumer.assign(partitions)
    committed = sink.committed_offsets({(topic, p.partition) for p in partitions})
    for tp in partitions:
        consumer.seek(tp, committed[(topic, tp.partition)] + 1)
    batch, first_at = [], 0.0
    try:
        while not stop.is_set():
            for records in consumer.poll(timeout_ms=100, max_records=BATCH_MAX).values():
                if not batch:
                    first_at = time.monotonic()
                batch += records
            if batch_due(
                len(batch), time.monotonic() - first_at, BATCH_MAX, BATCH_WITHIN_S, BATCH_EARLY, BATCH_EARLY_S
            ):
                sink.write(step_records(batch, WorkerConfig().max_screenshot_bytes).records)
                batch = []
    finally:
        if batch:
            sink.write(step_records(batch, WorkerConfig().max_screenshot_bytes).records)
        consumer.close()


# --- the benchmark ------------------------------------------------------------------------------------------------


def run_mode(mode: str, config: BenchConfig, base: Settings, screens: list[bytes], round_: int = 0) -> dict:
    # Fresh topics and tables per mode and round; the consumer starts only once the backlog is in.
    data_dir = config.out / "data" / f"{mode}-{round_}"
    if mode == "worker_s3":
        base = base.model_copy(update={"data_dir": config.s3_data_dir})  # a prefix of the run's own under it
    with local_stack(base, config.out / "logs", run=f"bench-{mode}", data_dir=data_dir, worker=False) as stack:
        settings, tables = stack.settings, stack.settings.tables_dir
        print(f"[{mode}] capacity: producing {config.events} steps into the backlog", flush=True)
        encode = ENCODINGS.get(mode, encode_event)
        backlog = produce_steps(settings, screens, config.events, "cap", config.steps_per_episode, encode=encode)
        consumer = start_consumer(mode, stack, config)
        try:
            print(f"[{mode}] capacity: draining the backlog ({backlog.events_per_s:.0f} steps/s produced)", flush=True)
            wait_for_rows(tables, set(backlog.event_ids), consumer, config.timeout_s)
            print(f"[{mode}] latency: {config.events} steps at {config.rate:.0f} steps/s", flush=True)
            live = produce_steps(settings, screens, config.events, "lat", config.steps_per_episode, config.rate, encode)
            wait_for_rows(tables, set(live.event_ids), consumer, config.timeout_s)
        finally:
            consumer.stop()
    rows = visible_rows(settings)  # the consumer has stopped: its last commit is in
    capacity, latency = phase_stats(rows, backlog.event_ids), phase_stats(rows, live.event_ids)
    return {
        "events": capacity["events"] + latency["events"],
        "events_per_s": capacity["drain_events_per_s"],
        "e2e_p50_s": latency["e2e_p50_s"],
        "e2e_p99_s": latency["e2e_p99_s"],
        "lost": capacity["lost"] + latency["lost"],
        "duplicated": capacity["duplicated"] + latency["duplicated"],
        "offered_rate": config.rate,
        "achieved_rate": round(live.events_per_s, 1),
        "mean_event_bytes": round((backlog.payload_bytes + live.payload_bytes) / max(1, config.events * 2)),
        "capacity": capacity,
        "latency": latency,
    }


def start_consumer(mode: str, stack: LocalStack, config: BenchConfig) -> Child:
    """The mode's consumer, started once its backlog is in: a `flywheel` process, or kafka-delta-ingest on the table
    it appends to (created for it) and the mode's own steps topic."""
    from processors.messages import BATCH_MAX  # our sinks' batch rule, kafka-delta-ingest's too

    if mode != "kdi":
        return stack.start(f"bench-{mode}", CONSUMER_ARGS[mode.removesuffix("_s3")])
    table = Path(table_uri(stack.settings.tables_dir, STEPS))
    shutil.rmtree(table, ignore_errors=True)  # an earlier run's: its offsets are another topic's, under the same app id
    kdi.create_table(table, kdi.kdi_schema())
    command = kdi.kdi_command(config.kdi_binary, topics_for(stack.settings).steps.name, table,
                              stack.settings.bootstrap, BATCH_MAX)  # fmt: skip
    return Child("kafka-delta-ingest", command[1:], config.out / "logs", {"RUST_LOG": "warn"}, program=command[:1])


def run_bench(config: BenchConfig, settings: Settings) -> dict:
    if config.kdi_binary and (settings.data_is_remote or settings.security_protocol != "PLAINTEXT"):
        raise ConfigError("--kdi-binary: kafka-delta-ingest runs here on local tables over a PLAINTEXT broker only")
    if config.s3_data_dir and not is_remote(config.s3_data_dir):
        raise ConfigError(f"--s3-data-dir {config.s3_data_dir!r}: give an s3://bucket/prefix "
                          "(local disk is the baseline)")  # fmt: skip
    config.out.mkdir(parents=True, exist_ok=True)
    screens = render_screens()
    report: dict = {"machine": machine()}
    modes = MODES + (("worker_s3",) if config.s3_data_dir else ()) + (("kdi",) if config.kdi_binary else ())
    runs: dict[str, list[dict]] = {mode: [] for mode in modes}
    with local_stack(settings, config.out / "logs", worker=False) as stack:  # one broker for every mode
        for round_ in range(config.rounds):
            for mode in modes if round_ % 2 == 0 else modes[::-1]:
                runs[mode].append(run_mode(mode, config, stack.settings, screens, round_))
    report |= {mode: over_rounds(runs[mode]) for mode in modes}
    worker, bare = report["worker"], report["bare_consumer"]
    ratio = worker["events_per_s"] / bare["events_per_s"] if bare["events_per_s"] else 0.0
    report["summary"] = {
        "worker_over_bare_throughput": round(ratio, 3),
        "worker_over_bare_per_round": [
            round(f["events_per_s"] / b["events_per_s"], 3) if b["events_per_s"] else 0.0
            for f, b in zip(runs["worker"], runs["bare_consumer"], strict=True)
        ],  # fmt: skip
        "client_steps_per_s": config.client_steps_per_s,
        "fleet_size_supported": int(worker["events_per_s"] // config.client_steps_per_s),
        "cpus": os.cpu_count(),
        "steps_per_episode": config.steps_per_episode,
        "mean_screenshot_bytes": round(sum(map(len, screens)) / len(screens)),
        "crc32c_extension": _has_crc32c(),
        "targets": {
            "throughput_ratio>=0.8": ratio >= 0.8,  # the bare consumer's pace, de-duplication and all
            "worker_e2e_p99_s<=1": worker["e2e_p99_s"] is not None and worker["e2e_p99_s"] <= 1.0,
            "worker_events_per_s>=1000": worker["events_per_s"] >= 1000,
            "lost==0_and_duplicated==0": all(report[m]["lost"] == 0 and report[m]["duplicated"] == 0 for m in modes),
        },
    }
    if "kdi" in report:
        over_kdi = worker["events_per_s"] / report["kdi"]["events_per_s"] if report["kdi"]["events_per_s"] else 0.0
        report["summary"]["worker_over_kdi_throughput"] = round(over_kdi, 3)
        report["summary"]["targets"]["worker_over_kdi>=1.0"] = over_kdi >= 1.0
    if "worker_s3" in report:
        on_s3 = report["worker_s3"]
        s3_ratio = on_s3["events_per_s"] / worker["events_per_s"] if worker["events_per_s"] else 0.0
        report["summary"]["s3_over_local_throughput"] = round(s3_ratio, 3)
        report["summary"]["targets"] |= {
            "s3_over_local_throughput>=0.7": s3_ratio >= 0.7,
            "worker_s3_e2e_p99_s<=2": on_s3["e2e_p99_s"] is not None and on_s3["e2e_p99_s"] <= 2.0,
        }
    (config.out / "pipeline_bench.json").write_text(json.dumps(report, indent=2))
    print(format_report(report))
    return report


def over_rounds(runs: list[dict]) -> dict:
    """A mode's figures over its rounds: medians of the rates and latencies, sums of the counts, each round kept."""

    def median(key: str) -> float | None:
        values = [run[key] for run in runs if run[key] is not None]
        return round(statistics.median(values), 3) if values else None

    return {
        "events": sum(run["events"] for run in runs),
        "events_per_s": median("events_per_s"),
        "e2e_p50_s": median("e2e_p50_s"),
        "e2e_p99_s": median("e2e_p99_s"),
        "lost": sum(run["lost"] for run in runs),
        "duplicated": sum(run["duplicated"] for run in runs),
        "offered_rate": runs[0]["offered_rate"],
        "achieved_rate": median("achieved_rate"),
        "mean_event_bytes": runs[0]["mean_event_bytes"],
        "rounds": runs,
    }


def _has_crc32c() -> bool:
    try:
        import crc32c  # noqa: F401
    except ImportError:
        return False
    return True


def format_report(report: dict) -> str:
    def cell(value) -> str:
        return "-" if value is None else f"{value}"

    rows = [
        ("events", "events"),
        ("events/s (backlog drain)", "events_per_s"),
        ("e2e p50 s (at offered rate)", "e2e_p50_s"),
        ("e2e p99 s (at offered rate)", "e2e_p99_s"),
        ("offered / achieved rate", None),
        ("lost", "lost"),
        ("duplicated", "duplicated"),
    ]
    modes = [m for m in (*MODES, "worker_s3", "kdi") if m in report]
    lines = [f"{'':30s}" + "".join(f" {m:>16s}" for m in modes)]
    for label, key in rows:
        if key is None:
            values = [f"{report[m]['offered_rate']:.0f}/{report[m]['achieved_rate']:.0f}" for m in modes]
        else:
            values = [cell(report[m][key]) for m in modes]
        lines.append(f"{label:30s}" + "".join(f" {v:>16s}" for v in values))
    s = report["summary"]
    if "s3_over_local_throughput" in s:
        lines.append(f"worker on S3 / on local disk throughput: {s['s3_over_local_throughput']:.2f}")
    if "worker_over_kdi_throughput" in s:
        lines.append(f"worker / kafka-delta-ingest throughput: {s['worker_over_kdi_throughput']:.2f}")
    lines.append("worker / bare per round: " + ", ".join(f"{r:.2f}" for r in s["worker_over_bare_per_round"]))
    lines.append(
        f"worker / bare throughput (medians): {s['worker_over_bare_throughput']:.2f}; fleet supported at "
        f"{s['client_steps_per_s']:g} steps/s per client: {s['fleet_size_supported']} clients"
    )
    lines.append("targets: " + ", ".join(f"{k} {'ok' if v else 'MISSED'}" for k, v in s["targets"].items()))
    return "\n".join(lines)


def command(config: BenchConfig, settings: Settings) -> int:
    """`flywheel bench pipeline`: exit 1 when either side lost or duplicated an event."""
    report = run_bench(config, settings)
    return 0 if all(report[m]["lost"] == 0 and report[m]["duplicated"] == 0 for m in ("worker", "bare_consumer")) else 1
