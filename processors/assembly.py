"""Episode assembly inside the steps batch, with Delta `steps` as the memory of last resort.

Open episodes are kept in memory. Their steps arrive in order on one partition (the steps topic is
keyed by episode_id), so when the final step arrives the episode is scored from what memory holds.
After a restart or a rebalance, memory lacks the steps committed before it; those are read back from
the `steps` table, which holds them exactly once. The worker sends the scored episodes before it
commits the batch's steps, so a crash in between re-delivers the steps and re-emits the episode
(the episodes sink drops the copy by episode_id) rather than losing it.

Every episode ends. One whose client died or went quiet mid-episode never sends its final step: once its
partition's event time (the newest produced_at seen there, never later than now) is more than `abandon_after_s`
past the time it last heard from the episode, it is closed as "abandoned" (processors.scoring.score_abandoned) and
emitted like a complete one. Event time, not the wall clock: a worker catching up on a backlog judges each episode
by the steps around it, not by how late it reads them; a partition without traffic closes nothing until its next
step. An episode is timed by its partition's clock, not by its own client's produced_at, so a client whose clock
runs behind is not abandoned for it (once the partition's clock runs: the first step a worker reads there starts
it), and the episodes a client played whole while cut off from Kafka are assembled as usual when its spool
arrives. A step of an episode closed so is late (the one a client was in when cut off for longer than the gap): it
is in `steps` (the worker commits every valid step) and counted (`on_late`), but it neither reopens nor emits the
episode again.

A partition no step reaches stops its event time, so what a client left open there just before it died would wait
for the next step forever (the fleet stopped, a quiet night). So `tick` (the worker calls it every few seconds) closes
everything a partition holds open once no step has reached it for `abandon_after_s` of the wall clock: idleness, as
stream processors define it. A backlog being read is never idle that long, so this never judges episodes by how late
they are read; a partition the brokers cannot serve for longer than the gap does close its open episodes early (their
later steps are late).

A restart or a lost partition forgets what was open, and what was closed. So an episode this process did not see
from its first step is looked up in the `episodes` table before it is scored: one already there is not emitted again
(and if it was abandoned, what came of it since is late). And a partition newly held (the first assignment after a
start, a rebalance) recovers what the worker before left open there: episodes with steps in `steps` of that Kafka
partition (produced within `recover_horizon_s`), no final step and no row in `episodes` are open again, with their
steps recalled, so one whose client is gone too is abandoned in its turn rather than never closed.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable

import polars as pl

from core.object_store import Location
from lake.queries import scan_table
from lake.tables import EPISODES, STEPS
from processors.scoring import EpisodeProgress, score_abandoned, score_episode
from processors.table_rows import utc_date
from schemas import EpisodeEvent, StepEvent


class EpisodeAssembler:
    def __init__(
        self,
        tables_dir: Location,
        abandon_after_s: float = 300.0,
        max_open: int = 100_000,
        on_late: Callable[[int], None] = lambda steps: None,
        clock: Callable[[], float] = time.time,
        recover_horizon_s: float = 86_400.0,
    ):
        self.tables_dir = tables_dir
        self.abandon_after_s = abandon_after_s
        self.max_open = max_open  # an overload guard: the oldest open episode beyond it is dropped unscored
        self.on_late = on_late  # called with a number of late steps
        self.clock = clock
        self.recover_horizon_s = recover_horizon_s  # how far back a newly held partition looks for open episodes
        self.open: dict[str, EpisodeProgress] = {}
        self.event_time: dict[int, float] = {}  # partition -> its newest produced_at, never later than now
        # partition -> open episode -> the partition's event time when its latest step came, oldest first
        self.heard: dict[int, dict[str, float]] = {}
        # Abandoned episode ids, oldest first, as many as may be open: their late steps are dropped. Beyond that,
        # the episodes sink's de-duplication by episode_id keeps the one row.
        self.closed: OrderedDict[str, None] = OrderedDict()
        self.arrived: dict[int, float] = {}  # partition -> wall clock of its latest step (or of its recovery)
        self._assigned: set[int] | None = None  # the steps partitions of the last rebalance, not applied yet
        self._held: set[int] = set()  # the steps partitions of the assignment applied last
        self._lock = threading.Lock()  # assign() comes from the event loop, observe() runs in a thread

    def observe(self, steps: Iterable[StepEvent], partition: int = 0) -> list[EpisodeEvent]:
        """Add steps of one partition (in its order); return the episodes they complete or abandon, scored."""
        self._apply_assignment()
        now = self.clock()
        finished = []
        self.arrived[partition] = now
        for step in steps:
            clock = self._advance(partition, min(step.produced_at, now))  # a clock ahead cannot abandon the others
            if step.episode_id in self.closed:
                self.on_late(1)
            elif (episode := self._add(step, partition, clock)) is not None:
                finished.append(episode)
            finished += self._abandon_quiet(partition)
        while len(self.open) > self.max_open:
            self.open.pop(next(iter(self.open)))  # the oldest open episode
        return finished

    def observe_batch(self, steps: dict[tuple[str, int, int], StepEvent]) -> list[EpisodeEvent]:
        """A batch's steps by (topic, partition, offset), each partition observed in its own order."""
        by_partition: dict[int, list[StepEvent]] = {}
        for (_topic, partition, _offset), step in steps.items():
            by_partition.setdefault(partition, []).append(step)
        return [episode for partition, part in by_partition.items() for episode in self.observe(part, partition)]

    def assign(self, partitions: Iterable[int]) -> None:
        """The steps partitions this worker holds after a rebalance (all of them: the group's eager rebalancing assigns
        whole). What it held of others is another worker's now, and stale should they come back: forgotten at the next
        batch."""
        with self._lock:
            self._assigned = set(partitions)

    def tick(self) -> list[EpisodeEvent]:
        """Close, as abandoned, every episode open on a partition no step has reached for `abandon_after_s` of the
        wall clock; return them scored."""
        self._apply_assignment()
        now, abandoned = self.clock(), []
        for partition, heard in self.heard.items():
            if heard and now - self.arrived.get(partition, now) > self.abandon_after_s:
                abandoned += self._close_heard(partition, lambda _heard_at: True)
        return abandoned

    def _apply_assignment(self) -> None:
        with self._lock:
            assigned, self._assigned = self._assigned, None
        if assigned is None:
            return
        for partition in [p for p in self.heard if p not in assigned]:
            for episode_id in self.heard.pop(partition):
                self.open.pop(episode_id, None)
        for partition in [p for p in self.event_time if p not in assigned]:
            del self.event_time[partition]
        newly, self._held = assigned - self._held, assigned
        if newly:
            self._recover_open(newly)

    def _recover_open(self, partitions: set[int]) -> None:
        """Open again what the worker before left open on `partitions`: their recent steps in `steps` whose episode
        has no final step there and no row in `episodes`; each heard at its latest step, each partition's event
        time at its newest step."""
        steps = scan_table(self.tables_dir, STEPS)
        if steps is None:
            return
        now = self.clock()
        since = now - self.recover_horizon_s
        recent = (  # the date filter prunes the table's date partitions; one read of the few columns needed
            steps.filter((pl.col("date") >= utc_date(since)) & (pl.col("produced_at") > since)
                         & pl.col("kafka_partition").is_in(sorted(partitions)))
            .select("episode_id", "kafka_partition", "step", "done", "task", "client_id", "model_version", "seed",
                    "produced_at", "reward", "verify_ok")
            .collect()
        )  # fmt: skip
        for partition, newest in recent.group_by("kafka_partition").agg(pl.col("produced_at").max()).iter_rows():
            self._advance(partition, min(newest, now))
            self.arrived[partition] = now
        unfinished = recent.group_by("episode_id").agg(pl.col("done").any()).filter(~pl.col("done"))
        episodes = scan_table(self.tables_dir, EPISODES)
        if episodes is not None and unfinished.height:
            closed = episodes.filter(pl.col("episode_id").is_in(unfinished["episode_id"].to_list()))
            unfinished = unfinished.join(closed.select("episode_id").collect(), on="episode_id", how="anti")
        rows = recent.join(unfinished.select("episode_id"), on="episode_id", how="semi").sort("produced_at")
        known = set(self.open) | set(self.closed)
        for row in rows.iter_rows(named=True):
            if row["episode_id"] in known:
                continue
            progress = self.open.setdefault(row["episode_id"], EpisodeProgress())
            progress.add_row(row)
            heard = self.heard.setdefault(row["kafka_partition"], {})
            heard.pop(row["episode_id"], None)
            heard[row["episode_id"]] = min(row["produced_at"], now)  # in produced_at order: newest last

    def _advance(self, partition: int, produced_at: float) -> float:
        """Move the partition's event time on to `produced_at` (never back); return it."""
        clock = max(self.event_time.get(partition, produced_at), produced_at)
        self.event_time[partition] = clock
        return clock

    def _add(self, step: StepEvent, partition: int, clock: float) -> EpisodeEvent | None:
        """Add a step to its open episode; the episode, scored, if the step completes it."""
        progress = self.open.setdefault(step.episode_id, EpisodeProgress())
        progress.add(step)
        heard = self.heard.setdefault(partition, {})
        heard.pop(step.episode_id, None)
        if not step.done:
            heard[step.episode_id] = clock  # the newest last: the clocks of a partition only grow
            return None
        del self.open[step.episode_id]
        if not self._catch_up(step.episode_id, progress):
            return None
        return score_episode(step, progress)

    def _abandon_quiet(self, partition: int) -> list[EpisodeEvent]:
        """Close the episodes of `partition` not heard from for more than abandon_after_s of its event time."""
        deadline = self.event_time[partition] - self.abandon_after_s
        return self._close_heard(partition, lambda heard_at: heard_at < deadline)

    def _close_heard(self, partition: int, due: Callable[[float], bool]) -> list[EpisodeEvent]:
        """Close the episodes of `partition` whose last-heard event time is `due`, oldest first, as abandoned."""
        heard, abandoned = self.heard.get(partition, {}), []
        while heard and due(heard[oldest := next(iter(heard))]):
            del heard[oldest]
            progress = self.open.pop(oldest, None)
            if progress is None:  # dropped by max_open
                continue
            self._close(oldest)
            if self._catch_up(oldest, progress):
                abandoned.append(score_abandoned(progress))
        return abandoned

    def _close(self, episode_id: str) -> None:
        self.closed[episode_id] = None
        while len(self.closed) > self.max_open:
            self.closed.popitem(last=False)

    def _catch_up(self, episode_id: str, progress: EpisodeProgress) -> bool:
        """Whether to score an episode: yes if this process saw it from its first step. Else (a restart, a rebalance)
        not if the `episodes` table has it already (when abandoned, what came of it since is late), and if not, its
        steps committed before are recalled first."""
        if len(progress.verified) >= progress.last_step + 1:
            return True
        ending = self._recorded_ending(episode_id)
        if ending == "abandoned":
            self._close(episode_id)
            self.on_late(len(progress.verified))
        if ending is not None:
            return False
        self._recall(episode_id, progress)
        return True

    def _recorded_ending(self, episode_id: str) -> str | None:
        """The episode's ending in the `episodes` table; None while it has no row there."""
        episodes = scan_table(self.tables_dir, EPISODES)
        if episodes is None:
            return None
        found = episodes.filter(pl.col("episode_id") == episode_id).select("termination").head(1).collect()
        return found["termination"][0] if found.height else None

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
