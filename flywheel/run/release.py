"""`flywheel release`: the reproducible trained VLA, from nothing to a committed artifact, with one command;
`flywheel demonstrations`: its first stage alone.

    1. expert demonstrations on the training suite through Kafka -> faust -> Delta: a local stack runs a
       fleet of edge clients with the scripted DOM experts, waits until every step is in Delta, stops and
       writes DIR/demonstrations.json (what was collected and the Delta table versions that hold it); a
       finished collection is reused (running again with the same settings does nothing)
    2. VLA SFT reading them from Delta at the recorded table versions (learner.algorithms.sft), resumable
    3. export the `.vla` bundle and its int8 variant, write manifest.json (config, seed, table versions,
       sha256, CPU time) next to them
Every stage resumes: a finished collection is reused, training continues from its checkpoint.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import time
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path

import polars as pl

from core.console import jsonable, say
from core.settings import SUITE_TASKS, Settings, parse_tasks
from edge_client.runner import EdgeConfig
from flywheel.run.fleet import FleetRun, run_fleet
from flywheel.run.stack import local_stack
from learner.algorithms.sft import train_vla
from learner.data.tables import load_samples, table_versions
from learner.model.checkpoints import save_weights
from learner.model.export import export_bundle, quantize_bundle
from learner.recipe import VLARecipe

REPORT_NAME = "demonstrations.json"


def expert_fleet() -> EdgeConfig:
    """The collection's clients: the scripted experts on Tier 1 and Tier 2 of the training suite, 100 episodes a task
    each, up to 12 steps (the longest suite tasks need 11)."""
    return EdgeConfig("demo-", tasks=SUITE_TASKS, episodes_per_task=100, policy="expert", max_steps=12)


@dataclass(frozen=True)
class DemonstrationsConfig:
    out: Path
    """Tables (out/data), logs and the report go here."""
    clients: int = 2
    """Edge clients, one browser each."""
    fleet: EdgeConfig = field(default_factory=expert_fleet)
    """Each client's settings (tasks, episodes_per_task, seed, max_steps); client k runs seeds seed + k * 100_000 + i:
    training seeds stay far below the eval seeds (1,000,000+)."""

    def collection(self) -> dict:
        """What was collected, as demonstrations.json records it (a finished collection of these is reused)."""
        fleet = self.fleet
        return {"tasks": list(fleet.tasks), "episodes_per_task": fleet.episodes_per_task, "clients": self.clients,
                "seed": fleet.seed, "max_steps": fleet.max_steps}  # fmt: skip


# The flags of `flywheel demonstrations`: --out, --clients and these four of the fleet's (the experts need no model,
# teacher or sampling settings).
DEMONSTRATION_FLEET_FLAGS = ("tasks", "episodes_per_task", "seed", "max_steps")
NOT_DEMONSTRATION_FLAGS = tuple(f"fleet.{f.name}" for f in fields(EdgeConfig)
                                if f.name not in DEMONSTRATION_FLEET_FLAGS)  # fmt: skip


def collect_demonstrations(config: DemonstrationsConfig, settings: Settings) -> dict:
    report_path = config.out / REPORT_NAME
    wanted = jsonable(config.collection())
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
                tasks=config.fleet.tasks,
                episodes_per_task=config.fleet.episodes_per_task,
                policy="expert",
                seed=config.fleet.seed,
                seed_stride=100_000,
                max_steps=config.fleet.max_steps,
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


def _collection(entry: dict, out: Path, seed: int) -> DemonstrationsConfig:
    """One entry of config["demonstrations"] ('tasks' may be an alias; 'seed_offset' from the recipe's seed)."""
    given = dict(entry)
    clients = int(given.pop("clients", DemonstrationsConfig.clients))
    given["tasks"] = parse_tasks(given.get("tasks", "suite"))
    given["seed"] = seed + int(given.pop("seed_offset", 0))
    return DemonstrationsConfig(out=out, clients=clients, fleet=replace(expert_fleet(), **given))


def release_demonstrations(raw: dict, work: Path, settings: Settings) -> list[dict]:
    """The collections a recipe's "demonstrations" list names, collected into work/demonstrations-i (or reused)."""
    # Several collections (e.g. the whole suite, then more of Tier 1), each its own tables; seeds must not overlap.
    seed = int(raw["seed"])
    return [
        collect_demonstrations(_collection(entry, work / f"demonstrations-{i}", seed), settings)
        for i, entry in enumerate(raw["demonstrations"])
    ]


def demonstration_steps(collections: list[dict]) -> pl.DataFrame:
    """Every collection's demonstration steps, read from Delta at its recorded table versions."""
    return pl.concat(
        [load_samples(Path(c["tables_dir"]), ("demo",), c["table_versions"]) for c in collections], how="vertical"
    )


def recipe_demonstrations(raw: dict, work: Path, settings: Settings) -> pl.DataFrame:
    """The demonstration steps a recipe names, collected into work (or reused): what `flywheel experiment` trains
    its arms on."""
    return demonstration_steps(release_demonstrations(raw, work, settings))


def per_task(frame: pl.DataFrame, train) -> dict[str, dict]:
    """Each task's demonstrations (episodes, steps, click steps, distinct click screens) and the samples training
    drew from it in expectation: map-only steps give every task with click steps an equal share; full steps a
    share by its steps (balance "rows"), an equal one ("tasks") or one by its mean episode length ("episodes")."""
    clicks = pl.col("action_type") == "click"
    counts = frame.group_by("task").agg(
        pl.col("episode_id").n_unique().alias("episodes"), pl.len().alias("steps"), clicks.sum().alias("click_steps"),
        pl.col("screenshot").filter(clicks).hash().n_unique().alias("click_screens"),
    ).sort("task")  # fmt: skip
    map_only = round(train.map_only_fraction * train.steps) * train.batch_size
    full = (train.steps * train.batch_size) - map_only
    click_tasks = counts.filter(pl.col("click_steps") > 0).height
    out = {}
    mean_length = pl.col("steps") / pl.col("episodes")
    counts = counts.with_columns((mean_length / mean_length.sum()).alias("length_share"))
    for row in counts.iter_rows(named=True):
        share = {"rows": row["steps"] / frame.height, "tasks": 1 / counts.height, "episodes": row["length_share"]}
        share = share[train.balance]
        drawn = full * share + (map_only / click_tasks if row["click_steps"] else 0.0)
        out[row["task"]] = {**{k: v for k, v in row.items() if k not in ("task", "length_share")},
                            "samples": round(drawn)}  # fmt: skip
    return out


def run_release(config_path: Path, work: Path, release_dir: Path, settings: Settings, steps: int | None = None) -> dict:
    """`steps`: train this many steps instead of the recipe's (recorded in the manifest's config)."""
    recipe = VLARecipe.load(config_path, steps=steps)
    config = recipe.raw if steps is None else {**recipe.raw, "train": {**recipe.raw.get("train", {}), "steps": steps}}
    seed = int(config["seed"])
    started = time.monotonic()
    collections = release_demonstrations(config, work, settings)
    frame = demonstration_steps(collections)
    say(f"training the VLA on {frame.height} demonstration steps from {len(collections)} collections")
    result = train_vla(frame, recipe, work / "train")
    pruning = result.pruning  # the checkpoint's, when the run resumed
    bundle = export_bundle(result.model, result.tokenizer, pruning, work / "model.vla")
    quantized = quantize_bundle(bundle, work / "model-int8.vla")
    weights = save_weights(work / "model.pt", result.model, result.tokenizer, pruning)  # torch twin for the bench
    release_dir.mkdir(parents=True, exist_ok=True)
    for path in (bundle, quantized, weights):
        shutil.copyfile(path, release_dir / path.name)
    digest = hashlib.sha256(bundle.read_bytes()).hexdigest()
    manifest = {
        "version": f"vla-release-{digest[:12]}",
        "artifact": bundle.name,
        "sha256": digest,
        "int8_artifact": quantized.name,
        "int8_sha256": hashlib.sha256(quantized.read_bytes()).hexdigest(),
        "torch_weights": weights.name,
        "torch_weights_sha256": hashlib.sha256(weights.read_bytes()).hexdigest(),
        "config": config,
        "config_file": str(config_path),
        "seed": seed,
        "demonstrations": [
            {k: c[k] for k in ("config", "episodes", "steps", "success_rate", "table_versions", "wall_s")}
            for c in collections
        ],
        "per_task": per_task(frame, recipe.train),
        "training": {
            "samples": frame.height,
            "steps": result.steps,
            "first_loss": result.losses[0] if result.losses else None,
            "final_loss": result.losses[-1] if result.losses else None,
            "samples_per_s": round(result.samples_per_s, 2),
            "wall_s_this_run": round(result.wall_s, 1),
            "cpu_s_this_run": round(result.cpu_s, 1),
            "parameters": result.num_parameters,
            "pruning": asdict(pruning),
        },
        "wall_s": round(time.monotonic() - started, 1),
    }
    manifest_path = release_dir / "manifest.json"
    previous = json.loads(manifest_path.read_text()) if manifest_path.exists() else {}
    if not result.losses and previous.get("torch_weights_sha256") == manifest["torch_weights_sha256"]:
        # A re-run that only re-exported: the figures of the run that trained these weights still hold.
        manifest["training"], manifest["wall_s"] = previous["training"], previous["wall_s"]
    manifest_path.write_text(json.dumps(manifest, indent=2))
    say(f"release {manifest['version']}: {release_dir / bundle.name} ({bundle.stat().st_size / 1e6:.1f} MB)")
    return manifest
