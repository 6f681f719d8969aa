"""`flywheel chaos`: the continuous flywheel on a 3-node cluster with two faust workers, faults struck on a seeded
schedule (flywheel.chaos.schedule), then the ledger check (flywheel.chaos.ledger).

    edge client k --(its own listener, behind proxy k: the cut)--> 3 Kafka nodes --> 2 faust workers --> Delta
        ^                                                                                                   |
        +--------------------- signed versions <-- learner daemon (killed and restarted) <----------------+

Each fault is struck, then watched until the flywheel shows it recovered (the pipeline lands steps again, the
learner publishes again, the cut client's spooled steps are in Delta, ...): DIR/chaos.json has each strike's time
and its time to recover (None: it did not within the run), the ledger's figures and the fleet's longest idle gap;
DIR/chaos.png the timeline.
"""

from __future__ import annotations

import json
import os
import random
import signal
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from core.console import jsonable, say
from core.processes import Child, browser_pids, child_pids, free_ports
from core.settings import TIER1_TASKS, Settings
from flywheel.admin.dlq import read_dead_letters
from flywheel.chaos.ledger import (
    check_books,
    check_learner_kills,
    closed_episodes,
    drain,
    ledger_ok,
    open_episode,
    read_client_ledgers,
)
from flywheel.chaos.proxy import Proxy
from flywheel.chaos.report import fleet_idle, plot_timeline
from flywheel.chaos.schedule import FAULTS, Strike, make_schedule
from flywheel.run.config import NOT_DEMO_FLAGS, DemoConfig, fleet_client, learner_args, worker_args
from flywheel.run.fleet import edge_args
from flywheel.run.stack import LocalStack, local_stack
from lake.queries import step_count
from registry.store import artifact_location, read_manifests
from streams import topic_admin
from streams.broker.jars import share_jars
from streams.broker.roles import role_settings, uses_roles
from streams.kafka_clients import make_producer
from streams.topics import topics_for

PREFIX = "f-"  # the fleet's client ids start with it


def chaos_run() -> DemoConfig:
    """The continuous run chaos strikes: 30 minutes on six Tier 1 tasks, and a learner that publishes early and often
    (a fresh model of the small demo recipe, its first SFT of 300 steps once 48 demonstrations are in, then a version
    every 2 minutes at most), so that versions keep coming between strikes."""
    demo = DemoConfig(out=Path("runs/chaos"))
    learner = replace(demo.learner, recipe="demo", start_from="", sft_steps=300, min_demos=48, every_minutes=2.0)
    fleet = replace(demo.fleet, tasks=TIER1_TASKS[:6], new_tasks=())  # what it measures is the ledger, not learning
    return replace(demo, minutes=30.0, fleet=fleet, learner=learner)


@dataclass
class ChaosConfig:
    run: DemoConfig = field(default_factory=chaos_run)
    """The continuous run under fire (flywheel.run.config): its length (the clients stop acting then; the drain and
    the ledger check follow), its clients (each behind its own proxy), where chaos.json, chaos.png and the logs go,
    the fleet and the learner daemon."""
    seed: int = 0
    """Seeds the schedule: the same seed strikes the same faults at the same moments."""
    faults: str = ",".join(FAULTS)
    """Comma-separated faults to strike (flywheel.chaos.schedule.FAULTS)."""
    strikes: int = 2
    """Strikes of each fault."""
    cut_s: float = 60.0
    """How long a cut client is cut off from every broker node."""
    warmup_s: float = 240.0
    """No strike before this: the experts' demonstrations land and the learner publishes a first version."""
    settle_s: float = 20.0
    """A strike waits at least this after its slot opens: the previous fault's recovery settles first."""
    recover_s: float = 60.0
    """The schedule leaves at least this between a strike and the next (its slot's end)."""
    recover_timeout_s: float = 600.0
    """A strike not recovered within this counts as not recovered."""


# Settings of the run that are no flags of `flywheel chaos`: what it does not run (turns, the end's evaluation and
# twin, Prometheus, machines, CPU pinning), what it sets itself (two supervised workers, whose faust processes it
# kills: their process flags), and what `flywheel demo` does not take either.
NOT_CHAOS_FLAGS = (
    "run.turns", "run.finetune_steps", "run.drain_timeout_s", "run.prometheus", "run.prometheus_port",
    "run.greedy_episodes", "run.twin", "run.workers", "run.machines", "run.learner_cpu_share", "run.worker.loglevel",
    "run.worker.restart", "run.finish_stage_s", "run.pass_at_k", "run.pass_at_k_seeds", "run.pass_at_k_temperature",
    "run.audit",
    "run.fleet.episodes_per_task", "run.fleet.repeats", *(f"run.{path}" for path in NOT_DEMO_FLAGS),
)  # fmt: skip


@dataclass
class Record:
    fault: str
    at_s: float
    detail: str = ""
    recovered_after_s: float | None = None


@dataclass
class Watch:
    record: Record
    struck: float  # monotonic
    recovered: Callable[[], bool]


@dataclass
class ChaosRun:
    config: ChaosConfig
    stack: LocalStack
    started: float
    clients: list[Child] = field(default_factory=list)
    killed: list[Child] = field(default_factory=list)  # clients SIGKILLed: their orphaned browsers reaped at the end
    client_ids: dict[int, str] = field(default_factory=dict)  # client k's current run's client id
    proxies: list[list[Proxy]] = field(default_factory=list)
    learners: list[Child] = field(default_factory=list)
    incarnations: list[int] = field(default_factory=list)
    injected: list[bytes] = field(default_factory=list)
    watches: list[Watch] = field(default_factory=list)
    records: list[Record] = field(default_factory=list)
    restores: list[tuple[float, Callable[[], None]]] = field(default_factory=list)
    learner_kills: list[dict] = field(default_factory=list)  # what each learner kill interrupted
    rng: random.Random = field(default_factory=random.Random)

    @property
    def settings(self) -> Settings:
        return self.stack.settings

    def now_s(self) -> float:
        return round(time.monotonic() - self.started, 1)

    def ledger(self, k: int) -> Path:
        return self.config.run.out / "ledgers" / f"client{k}.txt"

    def ledgers(self) -> list[Path]:
        return [self.ledger(k) for k in range(self.config.run.clients)]

    def owed(self, k: int) -> int:
        path = self.ledger(k)
        return len(read_client_ledgers([path])) if path.exists() else 0

    def landed(self, prefix: str = PREFIX) -> int:
        return step_count(self.settings.tables_dir, prefix)

    def learner_state(self) -> dict:
        path = self.stack.settings.learner_dir / "daemon" / "state.json"
        return json.loads(path.read_text()) if path.exists() else {"versions": []}

    def versions(self) -> int:
        return len(self.learner_state()["versions"])


def run_chaos(config: ChaosConfig, settings: Settings) -> dict:
    config = replace(config, run=replace(config.run, out=config.run.out.resolve()))
    config.run.out.mkdir(parents=True, exist_ok=True)
    (config.run.out / "ledgers").mkdir(exist_ok=True)
    faults = tuple(f for f in config.faults.split(",") if f)
    schedule = make_schedule(
        config.run.minutes,
        config.seed,
        config.strikes,
        faults,
        warmup_s=config.warmup_s,
        settle_s=config.settle_s,
        recover_s=config.recover_s,
    )
    home = config.run.out / "home"
    nodes, listeners = 3, config.run.clients
    run_settings = settings.model_copy(update={
        "home": home, "bootstrap_servers": "", "kafka_nodes": nodes, "kafka_edge_listeners": listeners,
        "kafka_port": free_ports(2 * nodes * (1 + listeners)),
    })  # fmt: skip
    share_jars(run_settings, settings)  # the jars of the caller's home, fetched there once
    say(f"chaos: {len(schedule)} strikes over {config.run.minutes} min (seed {config.seed}): "
        + ", ".join(f"{s.fault}@{s.at_s:.0f}s" for s in schedule))  # fmt: skip
    workers = worker_args(config.run.worker)
    with local_stack(run_settings, config.run.out / "logs", run="chaos", data_dir=config.run.out / "data",
                     worker_args=workers) as stack:  # fmt: skip
        stack.start_worker(*workers)
        run = ChaosRun(config, stack, time.monotonic(), rng=random.Random(config.seed))
        try:
            start_fleet(run)
            drive(run, schedule)
            drain(run.settings.tables_dir, run.ledgers(), run.config.run.worker.abandon_after_s)
        finally:
            for client in run.clients + run.killed:
                client.stop()
            for learner in run.learners:
                learner.stop()
            for proxies in run.proxies:
                for proxy in proxies:
                    proxy.close()
        report = check(run)
    (config.run.out / "chaos.json").write_text(json.dumps(report, indent=2))
    plot_timeline(config.run.out / "chaos.png", report)
    say(f"chaos: ledger {'ok' if report['ledger_ok'] else 'FAILED'}; every fault recovered: "
        f"{report['all_recovered']}; the learner continued after each kill: {report['learner_continued']}; "
        f"longest fleet idle {report['fleet']['longest_idle_s']} s; "
        f"versions {report['ledger']['versions']['published']}; {config.run.out / 'chaos.json'}")  # fmt: skip
    return report


def start_fleet(run: ChaosRun) -> None:
    settings = run.settings
    for k in range(run.config.run.clients):
        run.proxies.append([Proxy(p + 1, p).start() for p in (settings.kafka_edge_port(n, k)
                                                               for n in settings.kafka_node_ids)])  # fmt: skip
        run.incarnations.append(0)
        run.clients.append(start_client(run, k))
    run.learners.append(run.stack.start("learner", learner_args(run.config.run), role="learner"))


def start_client(run: ChaosRun, k: int, client_id: str | None = None) -> Child:
    """Client k, connected through its proxies only. A new incarnation after a restart gets a new client id, or
    `client_id`, the id of the run it replaces (a device back after a crash, which replays that run's spool on
    start); its seeds are its own either way, and so its episode ids."""
    n, remaining_s = run.incarnations[k], max(10.0, 60 * run.config.run.minutes - (time.monotonic() - run.started))
    client_id = client_id or f"{PREFIX}c{k}" + (f"r{n}" if n else "")
    run.client_ids[k] = client_id
    client = replace(fleet_client(run.config.run, remaining_s), client_id=client_id, seed=1000 * k + 100_000 * n,
                     summary_path=run.config.run.out / f"client{k}-{n}.json", ledger_path=run.ledger(k))  # fmt: skip
    return run.stack.start(f"client{k}-{n}", edge_args(client),
                           env={"FLYWHEEL_BOOTSTRAP_SERVERS": run.settings.edge_bootstrap(k)}, role="edge")  # fmt: skip


def drive(run: ChaosRun, schedule: list[Strike]) -> None:
    """Strike on schedule; watch each strike until it recovers; undo timed faults (a cut) when due."""
    pending, end = list(schedule), run.started + 60 * run.config.run.minutes
    last_check = 0.0
    # After the fleet stops, strikes still recovering are watched on (each up to recover_timeout_s), and the learner
    # is given as long again to publish after its last kill.
    while time.monotonic() < end or any(c.running() for c in run.clients) or run.watches or awaiting_version(run, end):
        now = time.monotonic()
        while pending and now - run.started >= pending[0].at_s:
            strike = pending.pop(0)
            record = Record(strike.fault, run.now_s())
            run.records.append(record)
            say(f"chaos @{record.at_s:.0f}s: {strike.fault}")
            try:
                recovered = STRIKES[strike.fault](run, record)
            except Exception as error:  # noqa: BLE001 - a strike that cannot be struck is a finding, not a crash
                record.detail = f"not struck: {error!r}"
                continue
            run.watches.append(Watch(record, now, recovered))
        for due, undo in [r for r in run.restores if r[0] <= now]:
            run.restores.remove((due, undo))
            undo()
        if now - last_check > 5:
            last_check = now
            for watch in list(run.watches):
                if watch.recovered():
                    watch.record.recovered_after_s = round(time.monotonic() - watch.struck, 1)
                    say(f"chaos: {watch.record.fault} @{watch.record.at_s:.0f}s recovered after "
                        f"{watch.record.recovered_after_s} s")  # fmt: skip
                    run.watches.remove(watch)
                elif time.monotonic() - watch.struck > run.config.recover_timeout_s:
                    run.watches.remove(watch)
        if not run.learners[-1].running() and not any(w.record.fault == "kill_learner" for w in run.watches):
            raise RuntimeError(f"the learner died on its own:\n{run.learners[-1].tail()}")
        time.sleep(1)


def awaiting_version(run: ChaosRun, end: float) -> bool:
    """The last learner kill is not yet followed by a published version (its stage still trains); up to
    recover_timeout_s past the run's end, after which the ledger reports the kill without one."""
    if not run.learner_kills or time.monotonic() > end + run.config.recover_timeout_s:
        return False
    return not any(v["published_at"] > run.learner_kills[-1]["at"] for v in run.learner_state()["versions"])


# --- the strikes: each does its harm and returns the test that it has recovered -------------------------------


def kill_worker(run: ChaosRun, record: Record) -> Callable[[], bool]:
    """SIGKILL one worker's faust process mid-batch; its supervisor (`flywheel process`) starts it again."""
    worker = run.rng.choice(run.stack.workers)
    victim = child_pids(worker.proc.pid)[0]
    os.kill(victim, signal.SIGKILL)
    record.detail, before = f"{worker.name}: faust pid {victim}", run.landed()
    return lambda: bool(set(child_pids(worker.proc.pid)) - {victim}) and run.landed() > before


def kill_leader(run: ChaosRun, record: Record) -> Callable[[], bool]:
    """SIGKILL the node leading steps partition 0; start it again 15 s later."""
    steps = topics_for(run.settings).steps.name
    node = topic_admin.partitions(run.settings, steps)[0].leader
    run.stack.stop_node(node, signal.SIGKILL)
    run.restores.append((time.monotonic() + 15, lambda: run.stack.start_node(node)))
    record.detail, before = f"node {node}", run.landed()

    def back() -> bool:
        if node in run.stack.nodes_stopped:
            return False
        in_sync = all(node in p.isr for p in topic_admin.partitions(run.settings, steps).values())
        return in_sync and run.landed() > before

    return back


def kill_learner(run: ChaosRun, record: Record) -> Callable[[], bool]:
    """SIGKILL the learner daemon (it is training all the time but when it polls); start it again at once with the
    same flags: it must continue from its state. Recovered when it is back at work: a training checkpoint written
    since the kill, or a version published. Whether it resumed the stage it was killed in (not from scratch) and
    when it published next, the ledger's learner-kill check says: a stage's training time is the machine's, not
    the recovery's."""
    learner = run.learners[-1]
    learner.stop(signal.SIGKILL, timeout=5)
    killed_at, state = time.time(), run.learner_state()
    stage = state.get("in_progress") or {}
    # Whether the stage had checkpointed: a training checkpoint under the daemon's directory written since it began.
    checkpointed = bool(stage) and newest_checkpoint_at(run) > stage["started_at"]
    run.learner_kills.append({"at": killed_at, "at_s": record.at_s, "in_progress": stage.get("stage", ""),
                              "checkpointed": checkpointed})  # fmt: skip
    published = len(state["versions"])
    run.learners.append(run.stack.start(f"learner-{len(run.learners)}", learner_args(run.config.run),
                                        role="learner"))  # fmt: skip
    record.detail = f"after {published} versions" + (f", mid-{stage['stage']}" if stage else ", between stages")
    return lambda: newest_checkpoint_at(run) > killed_at or run.versions() > published


def newest_checkpoint_at(run: ChaosRun) -> float:
    """When the learner daemon last wrote a training checkpoint (0: never)."""
    checkpoints = (run.settings.learner_dir / "daemon").glob("*/vla_checkpoint.pt")
    return max((c.stat().st_mtime for c in checkpoints), default=0.0)


def cut_client(run: ChaosRun, record: Record) -> Callable[[], bool]:
    """Cut one client off from every node for cut_s; it spools, and replays when the proxies are back."""
    k = run.rng.randrange(run.config.run.clients)
    restored: list[int] = []

    def restore() -> None:
        for proxy in run.proxies[k]:
            proxy.restore()
        restored.append(run.owed(k))

    run.restores.append((time.monotonic() + run.config.cut_s, restore))  # first: a cut that fails half-way is undone
    for proxy in run.proxies[k]:
        proxy.cut()
    record.detail = f"client {k} for {run.config.cut_s:.0f} s"
    return lambda: bool(restored) and run.landed(f"{PREFIX}c{k}") >= restored[0]


def kill_browser(run: ChaosRun, record: Record) -> Callable[[], bool]:
    """SIGKILL the chromium under one client: its env starts a new browser at the next episode."""
    k = run.rng.randrange(run.config.run.clients)
    browsers = browser_pids(run.clients[k].proc.pid)
    if not browsers:
        raise RuntimeError(f"no chromium runs under client {k}")
    for pid in browsers:
        os.kill(pid, signal.SIGKILL)
    record.detail, before = f"client {k}: chromium {browsers}", run.owed(k)
    return lambda: run.owed(k) > before + 1


def kill9_client(run: ChaosRun, record: Record) -> Callable[[], bool]:
    """SIGKILL one client mid-episode, as the OOM killer would: no episode end, no spool drain; its browser lives on,
    orphaned. It comes back under the same client id (edge_client.runner replays what the dead run left spooled)."""
    return _crash_client(run, record, whole_device=False)


def power_loss(run: ChaosRun, record: Record) -> Callable[[], bool]:
    """SIGKILL one client and its browser at once, as a device losing power; it comes back as kill9_client's does."""
    return _crash_client(run, record, whole_device=True)


def _crash_client(run: ChaosRun, record: Record, whole_device: bool) -> Callable[[], bool]:
    """Recovered when the step ledger's every step of the client is in Delta (the spool replayed), the episode it
    was in is closed (abandoned by the workers once its partition's event time has moved --abandon-after-s
    on) and its new run acts."""
    k = catch_mid_episode(run)
    dead, client_id = run.clients[k], run.client_ids[k]
    if whole_device:
        dead.stop(signal.SIGKILL, timeout=10)
    else:
        os.kill(dead.proc.pid, signal.SIGKILL)
        dead.proc.wait(10)
        run.killed.append(dead)  # its orphaned chromium, reaped at the end
    owed_steps, left_open = len(read_client_ledgers([run.ledger(k)])), open_episode(run.ledger(k))
    run.incarnations[k] += 1
    run.clients[k] = start_client(run, k, client_id)
    record.detail = f"client {k} ({client_id}) " + (f"in episode {left_open}" if left_open else "between episodes")

    def recovered() -> bool:
        closed = left_open is None or closed_episodes(run.settings.tables_dir, {left_open}) == 1
        return closed and run.landed(f"{PREFIX}c{k}") >= owed_steps and run.owed(k) > owed_steps + 1

    return recovered


def catch_mid_episode(run: ChaosRun, wait_s: float = 15.0) -> int:
    """A client in the middle of an episode (a step of it spooled, not its final one), the first of them in a seeded
    order that the clients' ledgers show so within `wait_s`; else (a fleet of one-step episodes) one of them."""
    order = run.rng.sample(range(run.config.run.clients), run.config.run.clients)
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        for k in order:
            if open_episode(run.ledger(k)) is not None:
                return k
        time.sleep(0.05)
    return order[0]


def corrupt_artifact(run: ChaosRun, record: Record) -> Callable[[], bool]:
    """Flip a byte of the newest artifact in the store and start one client anew, so it fetches that version: it
    must refuse it and keep acting. The store is repaired after 30 s, as an operator would."""
    manifest = read_manifests(run.settings.artifacts_dir)[-1]
    files, uri = run.settings.files(), artifact_location(manifest["artifact_uri"])  # a file:// or s3:// URI
    good = files.read(uri)
    bad = bytearray(good)
    bad[len(bad) // 2] ^= 0xFF
    files.write(uri, bytes(bad))
    k = run.rng.randrange(run.config.run.clients)
    run.clients[k].stop(leader_only=True)  # it ends its episode and drains its spool, as a restarted client does
    run.incarnations[k] += 1
    run.clients[k] = start_client(run, k)
    run.restores.append((time.monotonic() + 30, lambda: files.write(uri, good)))
    record.detail, log, before = f"{manifest['version']}, client {k} restarted", run.clients[k].log_path, run.owed(k)
    return lambda: "refusing model" in log.read_text(errors="replace") and run.owed(k) > before


def bad_events(run: ChaosRun, record: Record) -> Callable[[], bool]:
    """A burst of malformed and oversized events on the steps topic, as a broken client (the edge role) sends."""
    burst = [b"", b"\x00\xff garbage", b'{"kind": "step", "event_id": 7', json.dumps({"kind": "nope"}).encode(),
             os.urandom(256), b"x" * (1536 * 1024)]  # fmt: skip
    burst = [value + f" #{len(run.injected) + i}".encode() for i, value in enumerate(burst)]  # each one distinct
    login = role_settings(run.settings, "edge") if uses_roles(run.settings) else run.settings
    producer = make_producer(login, "chaos-bad-events")
    try:
        for value in burst:
            producer.send(topics_for(run.settings).steps.name, key=b"chaos", value=value).get(timeout=60)
    finally:
        producer.close(timeout=10)
    run.injected.extend(burst)
    record.detail = f"{len(burst)} events, the largest {max(map(len, burst))} bytes"
    return lambda: _dead_letters(run) >= len(run.injected)


STRIKES: dict[str, Callable[[ChaosRun, Record], Callable[[], bool]]] = {
    "kill_worker": kill_worker, "kill_leader": kill_leader, "kill_learner": kill_learner, "cut_client": cut_client,
    "kill_browser": kill_browser, "kill9_client": kill9_client, "power_loss": power_loss,
    "corrupt_artifact": corrupt_artifact, "bad_events": bad_events,
}  # fmt: skip


# --- the end: drain, ledger, figures ---------------------------------------------------------------------------


def check(run: ChaosRun) -> dict:
    settings = run.settings
    letters = [letter.value for letter in read_dead_letters(settings)]
    ledger = check_books(settings, run.ledgers(), letters, run.injected)
    kills = [r.at_s for r in run.records if r.fault == "kill_learner"]
    published = _published_at(run)
    learner_kills = check_learner_kills(run.learner_kills, run.learner_state()["versions"])
    return {
        "config": jsonable(asdict(run.config)),
        "faults": [asdict(r) for r in run.records],
        "all_recovered": all(r.recovered_after_s is not None for r in run.records),
        "ledger": ledger,
        "ledger_ok": ledger_ok(ledger),
        "versions_after_each_learner_kill": [sum(t > at for t in published) for at in kills],
        "learner_kills": learner_kills,
        "learner_continued": all(k["continued"] for k in learner_kills),
        "fleet": fleet_idle(run.settings.tables_dir, PREFIX),
        "published_at_s": published,
    }


def _published_at(run: ChaosRun) -> list[float]:
    """Seconds into the run of each published version."""
    wall_start = time.time() - (time.monotonic() - run.started)
    return [round(m["produced_at"] - wall_start, 1) for m in read_manifests(run.settings.artifacts_dir)]


def _dead_letters(run: ChaosRun) -> int:
    return len(read_dead_letters(run.settings))
