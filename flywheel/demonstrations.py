"""`flywheel demonstrations`: expert demonstrations at scale, through the real pipeline.

Starts Kafka and the faust processors, runs a fleet of edge clients with the scripted DOM experts on
the training suite, waits until every step is in Delta, stops everything and writes
`DIR/demonstrations.json` (what was collected and the Delta table versions that hold it). SFT then
reads the demonstrations from those tables at those versions.

A finished collection is reused: running the command again with the same settings does nothing.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from flywheel.fleet import FleetRun, jsonable, run_fleet, say
from flywheel.processes import Child
from flywheel.settings import SUITE_TASKS, Settings
from learner.data import table_versions
from streams.broker import ensure_topics, running_broker

REPORT_NAME = "demonstrations.json"


@dataclass(frozen=True)
class DemonstrationsConfig:
    out: Path = Path("runs/demonstrations")
    """Tables (out/data), logs and the report go here."""
    tasks: tuple[str, ...] = SUITE_TASKS
    """Tasks to demonstrate (default: Tier 1 and Tier 2 of the training suite)."""
    episodes_per_task: int = 100
    """Episodes per task and client."""
    clients: int = 2
    """Edge clients, one browser each."""
    seed: int = 0
    """Client k runs seeds seed + k * 100_000 + i: training seeds stay far below the eval seeds (1,000,000+)."""
    max_steps: int = 12


def collect_demonstrations(config: DemonstrationsConfig, settings: Settings) -> dict:
    report_path = config.out / REPORT_NAME
    wanted = jsonable({k: v for k, v in asdict(config).items() if k != "out"})
    if report_path.exists():
        report = json.loads(report_path.read_text())
        if report.get("config") == wanted:
            say(f"demonstrations already collected: {report_path}")
            return {**report, "tables_dir": str(config.out / report["tables_dir"])}
        raise RuntimeError(f"{report_path} holds a different collection; choose another --out")
    config.out.mkdir(parents=True, exist_ok=True)
    run_id = time.strftime("%Y%m%d-%H%M%S")
    settings = settings.model_copy(
        update={"data_dir": (config.out / "data").resolve(), "topic_prefix": f"{settings.topic_prefix}-demos-{run_id}"}
    )
    env = {"FLYWHEEL_DATA_DIR": str(settings.data_dir), "FLYWHEEL_TOPIC_PREFIX": settings.topic_prefix}
    logs = config.out / "logs"
    started = time.monotonic()
    with running_broker(settings):
        ensure_topics(settings)
        worker = Child("processors", ["process"], logs, env)
        try:
            fleet = run_fleet(
                FleetRun(
                    name="demos",
                    prefix="demo-",
                    clients=config.clients,
                    tasks=config.tasks,
                    episodes_per_task=config.episodes_per_task,
                    policy="expert",
                    seed=config.seed,
                    seed_stride=100_000,
                    max_steps=config.max_steps,
                    drain_timeout_s=900.0,
                ),
                settings, config.out, logs, worker, env,
            )  # fmt: skip
        finally:
            worker.stop()
    report = {
        "config": wanted,
        "tables_dir": str(settings.tables_dir.relative_to(config.out.resolve())),  # the collection may move
        "table_versions": table_versions(settings.tables_dir),
        "episodes": fleet.episodes,
        "steps": fleet.steps_in_delta,
        "success_rate": fleet.success_rate,
        "per_task": fleet.per_task,
        "wall_s": round(time.monotonic() - started, 1),
    }
    report_path.write_text(json.dumps(report, indent=2))
    report["tables_dir"] = str(settings.tables_dir)
    say(f"{fleet.episodes} expert episodes, {fleet.steps_in_delta} steps in Delta ({report['wall_s']:.0f} s)")
    return report
