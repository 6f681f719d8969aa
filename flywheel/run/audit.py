"""The main job's audit of what filtered BC kept on the new tasks (edge_client.audit): a seeded sample of the kept
successes replayed on their seeds with the DOM read, counted per task. It runs after the learner has stopped and
writes only to the report."""

from __future__ import annotations

import random

import polars as pl

from core.object_store import Location
from lake.tables import EPISODES, scan, table_uri
from learner.data.teacher_labels import load_filtered_successes
from schemas import Action


def audit_kept_successes(tables_dir: Location, tasks: tuple[str, ...], sample: int, seed: int = 0) -> dict:
    """{"audited", "reproduced", "steps", "steps_on_nothing", "with_a_step_on_nothing", "per_task": {...}} over up
    to `sample` of the episodes filtered BC keeps on `tasks` (drawn with `seed`)."""
    from edge_client.audit import audit_episode
    from edge_client.env import EnvConfig, GuiEnv

    rows = load_filtered_successes(tables_dir, tasks)
    seeds = scan(table_uri(tables_dir, EPISODES)).select("episode_id", "seed").collect()
    episodes = rows.join(seeds, on="episode_id").sort("episode_id", "step").group_by("episode_id", maintain_order=True)
    kept = [(frame["task"][0], int(frame["seed"][0]), actions_of(frame)) for _, frame in episodes]
    chosen = random.Random(seed).sample(kept, min(sample, len(kept)))
    per_task: dict[str, dict[str, int]] = {}
    if chosen:
        with GuiEnv(chosen[0][0], EnvConfig(read_dom=True)) as env:
            for task, episode_seed, actions in chosen:
                audit = audit_episode(env, task, episode_seed, actions)
                counts = per_task.setdefault(task, dict.fromkeys(COUNTS, 0))
                for key, value in (("audited", 1), ("reproduced", audit.reproduced), ("steps", audit.steps),
                                   ("steps_on_nothing", audit.steps_on_nothing),
                                   ("with_a_step_on_nothing", audit.steps_on_nothing > 0)):  # fmt: skip
                    counts[key] += int(value)
    total = {key: sum(c[key] for c in per_task.values()) for key in COUNTS}
    return {"kept": len(kept), **total, "per_task": per_task}


COUNTS = ("audited", "reproduced", "steps", "steps_on_nothing", "with_a_step_on_nothing")


def actions_of(frame: pl.DataFrame) -> list[Action]:
    """An episode's actions, in step order, from its SFT rows."""
    return [Action(type=r["action_type"], x=float(r["x"] or 0.0), y=float(r["y"] or 0.0), text=r["text"] or "",
                   key=r["key"] or "") for r in frame.iter_rows(named=True)]  # fmt: skip
