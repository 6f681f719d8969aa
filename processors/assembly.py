"""Episode assembly inside the steps batch, with Delta `steps` as the memory of last resort.

Open episodes are kept in memory. Their steps arrive in order on one partition (the steps topic is
keyed by episode_id), so when the final step arrives the episode is scored from what memory holds.
After a restart or a rebalance, memory lacks the steps committed before it; those are read back from
the `steps` table, which holds them exactly once. The worker sends the scored episodes before it
commits the batch's steps, so a crash in between re-delivers the steps and re-emits the episode
(the episodes sink drops the copy by episode_id) rather than losing it.
"""

from __future__ import annotations

import polars as pl

from core.object_store import Location
from lake.queries import scan_table
from lake.tables import STEPS
from processors.scoring import EpisodeProgress, score_episode
from schemas import EpisodeEvent, StepEvent


class EpisodeAssembler:
    def __init__(self, tables_dir: Location, max_open: int = 100_000):
        self.tables_dir = tables_dir
        self.max_open = max_open  # episodes abandoned mid-way by a dead client must not grow memory forever
        self.open: dict[str, EpisodeProgress] = {}

    def observe(self, steps: list[StepEvent]) -> list[EpisodeEvent]:
        """Add a batch of steps (batch order); return the episodes they complete, scored."""
        finished = []
        for step in steps:
            progress = self.open.setdefault(step.episode_id, EpisodeProgress())
            progress.add(step)
            if not step.done:
                continue
            if len(progress.verified) < step.step + 1:
                self._recall(step.episode_id, progress)
            finished.append(score_episode(step, progress))
            del self.open[step.episode_id]
        while len(self.open) > self.max_open:
            self.open.pop(next(iter(self.open)))  # the oldest open episode
        return finished

    def _recall(self, episode_id: str, progress: EpisodeProgress) -> None:
        """Fill in the steps committed before this process saw the episode."""
        steps = scan_table(self.tables_dir, STEPS)
        if steps is None:
            return
        earlier = steps.filter(pl.col("episode_id") == episode_id).select("step", "verify_ok", "produced_at").collect()
        for row in earlier.iter_rows(named=True):
            progress.verified.setdefault(row["step"], row["verify_ok"])
        if earlier.height:
            progress.first_produced_at = min(progress.first_produced_at or float("inf"), earlier["produced_at"].min())
