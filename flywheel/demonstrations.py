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

from core.console import jsonable, say
from core.settings import SUITE_TASKS, Settings
from flywheel.fleet import FleetRun, run_fleet
from flywheel.stack import local_stack
from learner.data import table_versions

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
    """An episode still running after this many steps ends as a failure."""


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
    started = time.monotonic()
    with local_stack(settings, config.out / "logs", run="demos", data_dir=config.out / "data") as stack:
        settings = stack.settings
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
            stack, config.out,
        )  # fmt: skip
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
