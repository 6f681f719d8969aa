"""`flywheel soak --hours H --out DIR`: the main job's parts run for hours, sampled every `sample_s`.

    K edge clients --> Kafka --> the worker (+ maintenance on its schedule) --> Delta --> the learner daemon
          ^                                                                               | versions
          +-------------------------------------------------------------------------------+
    every sample_s: each process's RSS, descriptors, threads and CPU (/proc); bytes and files of each table, the
    model store, the learner's runs and the Kafka log; consumer lag; the learner's read of its tables; steps a second

Each sample is a line of DIR/samples.jsonl. At the end the clients finish their episodes and drain their spools,
the ledger (flywheel.chaos.ledger) checks every step and episode landed once, and flywheel.soak.report fits the
series: DIR/soak.json and DIR/soak.png. Stopped early (SIGTERM, a crash, the session's end), the same command with
the same DIR continues: its broker, topics, tables, learner state, spools and ledgers are all under DIR, and
DIR/soak-state.json says how much of the run is done.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from core.console import jsonable, say
from core.processes import Child, descendants, free_ports, sigterm_requests_stop
from core.settings import Settings
from flywheel.admin.dlq import read_dead_letters
from flywheel.admin.observe import demo_observability
from flywheel.chaos.ledger import (
    check_books,
    drain,
    ledger_ok,
)
from flywheel.run.config import DemoConfig, fleet_client, learner_args, worker_args
from flywheel.run.fleet import edge_args
from flywheel.run.stack import LocalStack, local_stack
from flywheel.soak.report import plot_soak, soak_report
from flywheel.soak.sample import ProcessStats, dir_bytes, file_count, tree_stats
from lake.queries import step_count
from lake.tables import EPISODES, STEPS, TRAINING_SAMPLES, table_exists, table_uri
from learner.daemon.loop import table_counts
from processors.lag import LagExporter
from processors.maintenance import table_stats
from streams.broker.files import node_dir
from streams.broker.jars import share_jars
from streams.broker.nodes import running_pid

log = logging.getLogger(__name__)
PREFIX = "s-"  # the soak's client ids start with it
TABLES = (STEPS, EPISODES, TRAINING_SAMPLES)


def soak_run() -> DemoConfig:
    """The main job's continuous run with retention on: Delta maintenance (compaction, vacuum) every 2 minutes (the
    sinks commit about once a second per table, so a longer gap lets hundreds of small files pile up between
    passes), and the learner keeping its newest 5 versions and the runs it starts from again."""
    demo = DemoConfig(out=Path("runs/soak"))
    return replace(demo, worker=replace(demo.worker, maintenance_interval_s=120.0),
                   learner=replace(demo.learner, keep_versions=5))  # fmt: skip


@dataclass
class SoakConfig:
    run: DemoConfig = field(default_factory=soak_run)
    """The continuous run kept going (flywheel.run.config): its clients, fleet, learner daemon and worker, and DIR."""
    hours: float = 2.0
    """How long the fleet acts, summed over every resumed part; then the drain and the ledger check."""
    sample_s: float = 30.0
    """Seconds between samples."""
    fit_after_s: float = 900.0
    """Slopes and the start values of the targets are taken after this much of the run (caches and the first
    versions settle first)."""


# Settings of the run that are no flags of `flywheel soak`: its length is --hours; it runs no turns, no evaluation
# or twin at the end, one worker on one machine, and sets each client's id, seed and ledger itself.
NOT_SOAK_FLAGS = (
    "run.turns", "run.finetune_steps", "run.minutes", "run.greedy_episodes", "run.twin", "run.workers",
    "run.machines", "run.finish_stage_s", "run.pass_at_k", "run.pass_at_k_seeds", "run.pass_at_k_temperature",
    "run.audit", "run.fleet.episodes_per_task", "run.fleet.client_id", "run.fleet.seed", "run.fleet.policy",
    "run.fleet.bootstrap_expert", "run.fleet.channel", "run.fleet.summary_path", "run.fleet.stop_after_s",
    "run.fleet.ledger_path", "run.fleet.metrics_port", "run.fleet.wait_for_model_s", "run.fleet.spool_timeout_s",
    "run.learner.self_imitation_top_k", "run.learner.new_tasks", "run.learner.max_versions",
    "run.learner.stop_after_s", "run.worker.metrics_port", "run.learner_cpu_share",
)  # fmt: skip


@dataclass
class SoakState:
    """What a resumed soak needs of the parts before it (DIR/soak-state.json)."""

    topic_prefix: str
    kafka_port: int
    acted_s: float = 0.0  # the fleet's time so far, over every part
    parts: int = 0  # runs of the command on this DIR

    @staticmethod
    def load_or_start(path: Path, settings: Settings) -> SoakState:
        if path.exists():
            return SoakState(**json.loads(path.read_text()))
        prefix = f"{settings.topic_prefix}-soak-{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(2)}"
        return SoakState(prefix, free_ports(2))

    def save(self, path: Path) -> None:
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(self), indent=2))
        os.replace(tmp, path)


def run_soak(config: SoakConfig, settings: Settings) -> dict:
    out = config.run.out.resolve()
    config = replace(config, run=replace(config.run, out=out))
    (out / "ledgers").mkdir(parents=True, exist_ok=True)
    state_path = out / "soak-state.json"
    state = SoakState.load_or_start(state_path, settings)
    run_settings = settings.model_copy(update={
        "home": out / "home", "bootstrap_servers": "", "kafka_nodes": 1, "kafka_port": state.kafka_port,
        "topic_prefix": state.topic_prefix,
    })  # fmt: skip
    share_jars(run_settings, settings)  # the jars of the caller's home, fetched there once
    left_s = 3600 * config.hours - state.acted_s
    say(f"soak: part {state.parts + 1}, {left_s / 60:.1f} of {60 * config.hours:.0f} min left, "
        f"{config.run.clients} clients, a sample every {config.sample_s:.0f} s; {out}")  # fmt: skip
    state.parts += 1
    state.save(state_path)
    workers = worker_args(config.run.worker)
    with (
        demo_observability(out, config.run.prometheus, config.run.prometheus_port) as obs,
        local_stack(run_settings, out / "logs", data_dir=out / "data", env=obs.env, worker_args=workers) as stack,
    ):
        learner = stack.start("learner", learner_args(config.run), role="learner")
        clients = [start_client(config, stack, k, state, left_s) for k in range(config.run.clients)]
        sampler = Sampler(stack, out, learner, clients, obs.prometheus.proc.pid if obs.prometheus else None)
        try:
            finished = act(config, state, state_path, sampler, left_s)
            for client in clients:  # each finishes its episode and drains its spool
                client.stop(timeout=config.run.drain_timeout_s, leader_only=True)
            learner.stop()  # no publish (nor retirement) while the books are read
            if not finished:
                say(f"soak: stopped after {state.acted_s / 60:.1f} min; the same command on {out} continues")
                return {"finished": False, "acted_s": state.acted_s}
            drain(stack.settings.tables_dir, ledgers(config), config.run.worker.abandon_after_s)
            books = check(config, stack)
        finally:
            for child in [*clients, learner]:
                child.stop()
            sampler.close()
    samples = read_samples(out)
    report = soak_report(samples, books, config.fit_after_s) | {"config": jsonable(asdict(config))}
    (out / "soak.json").write_text(json.dumps(report, indent=2))
    plot_soak(out / "soak.png", samples)
    say(f"soak: {state.acted_s / 3600:.2f} h; targets {report['targets']}; {out / 'soak.json'}")
    return report


def start_client(config: SoakConfig, stack: LocalStack, k: int, state: SoakState, run_s: float) -> Child:
    """Client k of this part: the same client id in every part, so a part's client replays what the last part left
    in its spool; seeds of its own in each part, so no episode id repeats."""
    client = replace(fleet_client(config.run, run_s), client_id=f"{PREFIX}c{k}", seed=1000 * k + 100_000 * state.parts,
                     ledger_path=ledgers(config)[k])  # fmt: skip
    return stack.start(f"client{k}-{state.parts}", edge_args(client), role="edge")


def ledgers(config: SoakConfig) -> list[Path]:
    return [config.run.out / "ledgers" / f"client{k}.txt" for k in range(config.run.clients)]


def act(config: SoakConfig, state: SoakState, state_path: Path, sampler: Sampler, left_s: float) -> bool:
    """Sample every sample_s while the fleet acts; False when a SIGTERM stops the part early."""
    end = time.monotonic() + left_s
    last = time.monotonic()
    with sigterm_requests_stop() as stop_requested, (config.run.out / "samples.jsonl").open("a") as samples:
        while time.monotonic() < end:
            if stop_requested.wait(min(config.sample_s, max(0.0, end - time.monotonic()))):
                return False
            now = time.monotonic()
            state.acted_s += now - last
            last = now
            samples.write(json.dumps(sampler.sample(state.acted_s) | {"part": state.parts}) + "\n")
            samples.flush()
            state.save(state_path)
            sampler.require_alive()
    return True


class Sampler:
    """Reads one sample of every series: processes from /proc, bytes and files from disk, lag from the brokers and
    the Delta offsets, the learner's read as its poll does it, and the fleet's steps from the steps table."""

    def __init__(self, stack: LocalStack, out: Path, learner: Child, clients: list[Child], prometheus: int | None):
        self.stack, self.out, self.learner, self.clients, self.prometheus = stack, out, learner, clients, prometheus
        self.settings = stack.settings
        self.lag = LagExporter(self.settings)
        self.last_steps: tuple[float, int] | None = None

    def processes(self) -> dict[str, ProcessStats | None]:
        found = {"soak": tree_stats([os.getpid()])}
        for i, worker in enumerate(self.stack.workers):  # the supervisor and its faust process
            found[f"worker{i}"] = tree_stats([worker.proc.pid, *descendants(worker.proc.pid)])
        found["learner"] = tree_stats([self.learner.proc.pid, *descendants(self.learner.proc.pid)])
        for k, client in enumerate(self.clients):  # the client; its chromedriver and chromium apart
            found[f"client{k}"] = tree_stats([client.proc.pid])
            found[f"client{k}-browser"] = tree_stats(descendants(client.proc.pid))
        for node in self.settings.kafka_node_ids:
            pid = running_pid(self.settings, node)
            found[f"kafka{node}"] = tree_stats([pid]) if pid else None
        if self.prometheus:
            found["prometheus"] = tree_stats([self.prometheus])
        return found

    def tables(self) -> dict[str, dict]:
        found = {}
        for table in TABLES:
            uri = table_uri(self.settings.tables_dir, table)
            if not table_exists(uri):
                continue
            stats = table_stats(uri)
            path = Path(self.settings.tables_dir) / table
            found[table] = {"bytes": dir_bytes(path), "live_files": stats.files, "files_on_disk": file_count(
                path, ".parquet"), "log_files": stats.log_files, "open_s": round(stats.open_s, 4)}  # fmt: skip
        return found

    def disk(self) -> dict[str, int]:
        settings = self.settings
        kafka = sum(dir_bytes(p) for n in settings.kafka_node_ids
                    for p in (node_dir(settings, n) / "data").glob(f"{settings.topic_prefix}*"))  # fmt: skip
        return {"artifacts": dir_bytes(Path(settings.artifacts_dir)), "learner": dir_bytes(settings.learner_dir),
                "kafka_log": kafka, "prometheus": dir_bytes(self.out / "prometheus"),
                "logs": dir_bytes(self.out / "logs"), "spools": dir_bytes(settings.home / "spool"),
                "ledgers": dir_bytes(self.out / "ledgers")}  # fmt: skip

    def consumer_lag(self) -> dict[str, float]:
        lag: dict[str, float] = {}
        for family in self.lag.poll():
            if family.name == "kafka_consumergroup_lag":
                for sample in family.samples:
                    group = sample.labels["consumergroup"]
                    lag[group] = lag.get(group, 0.0) + sample.value
        return lag

    def learner_read_s(self) -> float:
        """The learner daemon's poll: its counts over the episodes and steps tables (learner.daemon.loop)."""
        started = time.perf_counter()
        table_counts(self.settings.tables_dir, since=time.time() - 600)
        return round(time.perf_counter() - started, 4)

    def steps_per_s(self, now: float) -> tuple[int, float | None]:
        steps = step_count(self.settings.tables_dir, PREFIX)
        rate = None if self.last_steps is None else (steps - self.last_steps[1]) / max(1e-9, now - self.last_steps[0])
        self.last_steps = (now, steps)
        return steps, None if rate is None else round(rate, 3)

    def sample(self, acted_s: float) -> dict:
        now = time.monotonic()
        steps, rate = tried(lambda: self.steps_per_s(now), (None, None))
        have_tables = tried(lambda: table_exists(table_uri(self.settings.tables_dir, EPISODES)), False)
        return {
            "t_s": round(acted_s, 1), "wall": round(time.time(), 1),
            "processes": {name: asdict(s) if s else None for name, s in self.processes().items()},
            "tables": tried(self.tables, {}), "disk": self.disk(), "lag": tried(self.consumer_lag, {}),
            "learner_read_s": tried(self.learner_read_s, None) if have_tables else None, "steps": steps,
            "steps_per_s": rate, "versions": len(tried(self.learner_versions, [])),
        }  # fmt: skip

    def learner_versions(self) -> list[dict]:
        path = self.settings.learner_dir / "daemon" / "state.json"
        return json.loads(path.read_text())["versions"] if path.exists() else []

    def require_alive(self) -> None:
        for child in [*self.stack.workers, self.learner]:
            if not child.running():
                raise RuntimeError(f"{child.name} exited ({child.proc.returncode}) during the soak:\n{child.tail()}")

    def close(self) -> None:
        self.lag.stop()


def tried(read, missing):
    """`read()`, or `missing` when it fails (a table mid-commit, a broker's hiccup): one series' gap in a sample,
    never the end of an hours-long run."""
    try:
        return read()
    except Exception as error:  # noqa: BLE001 - whatever one reader raises, the others still sample
        log.warning("soak: a sample's read failed: %r", error)
        return missing


def check(config: SoakConfig, stack: LocalStack) -> dict:
    letters = [letter.value for letter in read_dead_letters(stack.settings)]
    books = check_books(stack.settings, ledgers(config), letters, injected=[])  # any dead letter is unexplained
    return books | {"ok": ledger_ok(books)}


def read_samples(out: Path) -> list[dict]:
    lines = (out / "samples.jsonl").read_text().splitlines() if (out / "samples.jsonl").exists() else []
    return [json.loads(line) for line in lines if line.strip()]
