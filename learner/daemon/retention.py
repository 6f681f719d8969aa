"""What the learner daemon keeps as it publishes for hours: the last `keep_versions` versions in the model store, plus
every version still needed, and only the training runs a stage still starts from. Without it each version adds its
bundle to the store (about 8 MB) and its run to the learner's directory (about 30 MB), and every table version a
version trained on stays pinned against vacuum for good.

Still needed, whatever its age:
    a channel's head         what the fleet is told to run (stable, and the canary while one is out)
    the daemon's newest      the version the next one descends from
    its SFT versions         the RL stages' reference, the twin's start, the first version a run evaluates
    a version in use         one a client produced an episode with in the last IN_USE_S (a client swaps only at an
                             episode's end, and one that was offline swaps when it is back)
    a kept version           an operator's hold: a file `<artifacts>/keep/<version>`
A retired version's manifest moves to `<artifacts>/retired/`: the lineage of later versions still reads it.
"""

from __future__ import annotations

import logging
import shutil
import time
from pathlib import Path

import polars as pl

from core.object_store import join
from core.settings import Settings
from lake.queries import scan_table
from lake.tables import EPISODES
from registry.store import read_manifests, retire, versions_to_retire
from streams.model_versions import latest_by_channel

log = logging.getLogger(__name__)
IN_USE_S = 900.0


def retire_versions(settings: Settings, keep: set[str], keep_versions: int) -> list[str]:
    """Retire every version of the store but the newest `keep_versions`, `keep` (the daemon's own: its newest, its
    SFT) and those still needed; their ids."""
    manifests = read_manifests(settings.artifacts_dir, skip_unreadable=False)  # never act on a partial view
    needed = keep | heads(settings) | in_use(settings) | held(settings)
    retiring = versions_to_retire(manifests, keep_versions, needed)
    gone = {m["version"] for m in retiring}
    named_by_live = {m.get("sha256") for m in manifests if m["version"] not in gone}
    for manifest in retiring:
        retire(settings.artifacts_dir, manifest, named_by_live)
    if retiring:
        log.warning("retired %d versions (keeping the last %d and %s)", len(retiring), keep_versions, sorted(needed))
    return sorted(gone)


def heads(settings: Settings) -> set[str]:
    return {event.version for event in latest_by_channel(settings).values()}


def in_use(settings: Settings, within_s: float = IN_USE_S) -> set[str]:
    episodes = scan_table(settings.tables_dir, EPISODES)
    if episodes is None:
        return set()
    recent = episodes.filter(pl.col("produced_at") > time.time() - within_s).select("model_version").unique()
    return set(recent.collect()["model_version"].to_list())


def held(settings: Settings) -> set[str]:
    return {Path(str(p)).name for p in settings.files().list(join(settings.artifacts_dir, "keep"))}


def prune_runs(work: Path, starts: set[str]) -> list[str]:
    """Delete the stage runs under `work` (the daemon's directory) but the runs a stage starts from again (`starts`,
    by directory name: the SFT run, every RL stage's reference and the twin's start; the newest version's, which
    offline and online RL start from; the current online run, whose optimizer goes on); the twins' runs are theirs.
    Called between stages: none is in progress."""
    pruned = []
    for run in sorted(p for p in work.iterdir() if p.is_dir() and not p.name.startswith("twin-of-")):
        if run.name not in starts:
            shutil.rmtree(run, ignore_errors=True)
            pruned.append(run.name)
    return pruned
