"""Training data from the Delta tables: gold `training_samples` joined to bronze `steps`."""

from __future__ import annotations

from pathlib import Path

import polars as pl
from deltalake import DeltaTable

from lake.tables import STEPS, TRAINING_SAMPLES, table_uri

SFT_COLUMNS = [
    "episode_id", "step", "task", "instruction", "screenshot", "thought", "action_type", "x", "y", "text", "key"
]  # fmt: skip


def table_versions(tables_dir: Path) -> dict[str, int]:
    """Current version of each table the learner reads: the lineage a model version records."""
    return {name: DeltaTable(table_uri(tables_dir, name)).version() for name in (STEPS, TRAINING_SAMPLES)}


def load_samples(tables_dir: Path, purposes: tuple[str, ...], versions: dict[str, int] | None = None) -> pl.DataFrame:
    """Rows of `training_samples` with the given purposes, joined to their step payloads.

    `versions` pins the table versions read (time travel), so a training run is reproducible.
    """
    versions = versions or table_versions(tables_dir)
    samples = (
        pl.scan_delta(table_uri(tables_dir, TRAINING_SAMPLES), version=versions[TRAINING_SAMPLES])
        .filter(pl.col("purpose").is_in(list(purposes)))
        .select("episode_id", "step", "purpose", "weight")
    )
    steps = pl.scan_delta(table_uri(tables_dir, STEPS), version=versions[STEPS]).select(SFT_COLUMNS)
    return samples.join(steps, on=["episode_id", "step"], how="inner").collect()
