"""`flywheel release`: the reproducible trained VLA, from nothing to a committed artifact, with one command.

    1. expert demonstrations on the training suite through Kafka -> faust -> Delta (flywheel.demonstrations)
    2. VLA SFT reading them from Delta at the recorded table versions (learner.vla_sft), resumable
    3. export the `.vla` bundle and its int8 variant, write manifest.json (config, seed, table versions,
       sha256, CPU time) next to them

Every stage resumes: a finished collection is reused, training continues from its checkpoint.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import time
from dataclasses import asdict
from pathlib import Path

import polars as pl

from core.console import say
from core.settings import Settings, parse_tasks
from flywheel.demonstrations import DemonstrationsConfig, collect_demonstrations
from learner.checkpoints import save_weights
from learner.config import VLARecipe
from learner.data import load_samples
from learner.vla_export import export_bundle, quantize_bundle
from learner.vla_sft import train_vla


def _collection(entry: dict, seed: int) -> dict:
    """One entry of config["demonstrations"] as DemonstrationsConfig fields ('tasks' may be an alias)."""
    fields = dict(entry)
    fields["tasks"] = parse_tasks(fields.get("tasks", "suite"))
    fields["seed"] = seed + int(fields.pop("seed_offset", 0))
    return fields


def release_demonstrations(raw: dict, work: Path, settings: Settings) -> list[dict]:
    """The collections a recipe's "demonstrations" list names, collected into work/demonstrations-i (or reused)."""
    # Several collections (e.g. the whole suite, then more of Tier 1), each its own tables; seeds must not overlap.
    seed = int(raw["seed"])
    return [
        collect_demonstrations(
            DemonstrationsConfig(out=work / f"demonstrations-{i}", **_collection(entry, seed)), settings
        )
        for i, entry in enumerate(raw["demonstrations"])
    ]


def demonstration_steps(collections: list[dict]) -> pl.DataFrame:
    """Every collection's demonstration steps, read from Delta at its recorded table versions."""
    return pl.concat(
        [load_samples(Path(c["tables_dir"]), ("demo",), c["table_versions"]) for c in collections], how="vertical"
    )


def run_release(config_path: Path, work: Path, release_dir: Path, settings: Settings) -> dict:
    recipe = VLARecipe.load(config_path)
    config = recipe.raw
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
