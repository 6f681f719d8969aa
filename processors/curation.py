"""Curation that keeps raising the bar: what enters `training_samples`, with what weight, and why.

The decision rests on the current model's live success per task: its last WINDOW scored episodes there
(model episodes only; the window slides, so it follows the fleet as new versions take over).

    demonstrations      kept (1.0); down-weighted (0.2) on tasks the model already solves (>= SOLVED)
    model successes     hard (task success < HARD or not yet measured): 2.0; solved tasks: 0.1; else 1.0
    model failures      diverged from a success on the same seed: 2.0 (a DPO pair in the offline stage);
                        near miss (most of several steps verified): 1.5; on a solved task: 1.5; else 0.5
    dropped             failed demonstrations, browser errors and abandoned episodes (closed without a final step
                        when their client went quiet: processors.assembly); the last two say nothing about the policy,
                        so neither is counted in its live success either

Exactly once, and the same on a replay: the scorer keys episodes by task, so one partition holds a task's
whole history in one order, and an episode is judged on the episodes of its task *before it in that
partition*: the rows already in the Delta `episodes` table below its offset, plus the batch's earlier
ones. Neither a restart, a redelivered batch, a rebalance nor `flywheel replay` changes that history.
A partition's history is kept in memory between batches (`CurationHistory`: the live success and solved seeds
its rows add up to, advanced by each batch), so a batch costs its own episodes, not the table's; it is read again
from the table (eight narrow columns of that partition's rows) when it may be stale: on first use, for a batch that
does not start after what it saw (a redelivery, a rebalance), and after a commit to `episodes` that was not ours.
"""

from __future__ import annotations

from collections import OrderedDict, defaultdict, deque
from collections.abc import Iterable
from dataclasses import dataclass

from schemas import EpisodeEvent

SOLVED = 0.95
HARD = 0.5
WINDOW = 50  # model episodes per task the live success is measured over
MIN_EPISODES = 10  # fewer than this: not measured yet
NEAR_MISS_VERIFIED = 0.8  # a failure whose steps were verified at least this often came close
MAX_SOLVED_SEEDS = 100_000  # (task, seed) pairs remembered as solved, oldest forgotten first
MAX_SEEN = 10_000  # episode ids a partition remembers, so that a re-emitted episode counts once (it follows soon)
NOT_THE_POLICY = ("error", "abandoned")  # endings that say nothing about the policy: not curated, not its live success


@dataclass(frozen=True)
class Curated:
    purpose: str  # demo | success | failure
    weight: float
    reason: str


class LiveSuccess:
    """The model's recent success per task, and the (task, seed)s some episode has solved."""

    def __init__(self, window: int = WINDOW):
        self.recent: dict[str, deque[bool]] = defaultdict(lambda: deque(maxlen=window))
        self.solved_seeds: OrderedDict[tuple[str, int], None] = OrderedDict()

    def observe(self, task: str, seed: int | None, success: bool, policy: str) -> None:
        if policy == "model":
            self.recent[task].append(success)
        if success and seed is not None:
            self.solved_seeds[(task, seed)] = None
            self.solved_seeds.move_to_end((task, seed))
            if len(self.solved_seeds) > MAX_SOLVED_SEEDS:
                self.solved_seeds.popitem(last=False)

    def rate(self, task: str) -> float | None:
        """The model's success rate on `task` over its window; None before MIN_EPISODES episodes."""
        outcomes = self.recent.get(task)
        if not outcomes or len(outcomes) < MIN_EPISODES:
            return None
        return sum(outcomes) / len(outcomes)


HISTORY_COLUMNS = ["episode_id", "task", "seed", "success", "policy", "termination", "kafka_partition",
                   "kafka_offset"]  # fmt: skip


class PartitionMemory:
    """One partition's episodes as curation sees them, in offset order: the model's live success per task and the
    solved seeds (LiveSuccess), each episode_id once (among the last MAX_SEEN), and the last offset seen."""

    def __init__(self) -> None:
        self.live = LiveSuccess()
        self.seen: OrderedDict[str, None] = OrderedDict()
        self.through = -1

    def observe(self, offset: int, row: dict) -> None:
        """An episode (a row of HISTORY_COLUMNS) at `offset`, after every one before it."""
        self.through = offset
        if row["episode_id"] in self.seen:
            return
        self.seen[row["episode_id"]] = None  # the first copy is the one the table keeps, whatever its ending
        if len(self.seen) > MAX_SEEN:
            self.seen.popitem(last=False)
        if row["termination"] in NOT_THE_POLICY:
            return
        self.live.observe(row["task"], row["seed"], bool(row["success"]), row["policy"])

    def curate(self, offset: int, episode: EpisodeEvent) -> Curated | None:
        """Judge an episode on what came before it, then remember it."""
        decision = _judge(episode, self.live)
        self.observe(offset, history_row(episode))
        return decision


def history_row(episode: EpisodeEvent) -> dict:
    return {"episode_id": episode.episode_id, "task": episode.task, "seed": episode.seed, "success": episode.success,
            "policy": episode.policy, "termination": episode.termination}  # fmt: skip


def curate_batch(batch: list[tuple[int, int, EpisodeEvent]], history: Iterable[dict]) -> list[Curated | None]:
    """The curation of each (partition, offset, episode) of a batch, judged on the episodes before it.

    `history`: rows (HISTORY_COLUMNS) of the `episodes` table for the batch's tasks; rows at or above an
    episode's offset are not its history (a redelivered batch finds itself in the table)."""
    entries: dict[tuple[int, int], dict] = {}
    for row in history:
        entries[(row["kafka_partition"], row["kafka_offset"])] = row
    judged = {}
    for partition, offset, episode in batch:
        entries[(partition, offset)] = history_row(episode)
        judged[(partition, offset)] = episode
    memory: dict[int, PartitionMemory] = defaultdict(PartitionMemory)  # a task lives in one partition
    decisions: dict[tuple[int, int], Curated | None] = {}
    for partition, offset in sorted(entries):
        if (partition, offset) in judged:
            decisions[(partition, offset)] = memory[partition].curate(offset, judged[(partition, offset)])
        else:
            memory[partition].observe(offset, entries[(partition, offset)])
    return [decisions[(partition, offset)] for partition, offset, _ in batch]


class CurationHistory:
    """Each partition's PartitionMemory, kept between the batches of one `episodes` sink (a DeltaSink): `curate` a
    batch, commit its episodes, then `committed`. A memory is read again from the table when it may be stale: first
    use, a batch of the partition not after its last offset, or a table version other than the one our last commit
    made (someone else committed, or our commit did not follow directly on what the memories reflect)."""

    def __init__(self, sink):
        self.sink = sink
        self.memory: dict[int, PartitionMemory] = {}
        self.version: int | None = None  # the table version the memories reflect
        self.judged_at: int | None = None  # the table version the last batch was judged at

    def curate(self, batch: list[tuple[int, int, EpisodeEvent]]) -> list[Curated | None]:
        self.sink.refresh()
        self.judged_at = self.sink.version()
        if self.judged_at != self.version:
            self.memory.clear()
        judged: dict[int, dict[int, EpisodeEvent]] = defaultdict(dict)  # a repeated offset: its last copy, as the
        for partition, offset, episode in batch:  # reference keeps
            judged[partition][offset] = episode
        decisions: dict[tuple[int, int], Curated | None] = {}
        for partition, episodes in judged.items():
            memory = self.memory.get(partition)
            if memory is None or min(episodes) <= memory.through:  # stale: the partition's rows and the batch merged
                memory = self.memory[partition] = PartitionMemory()
                entries = {row["kafka_offset"]: row for row in self._rows(partition)}
                entries.update(episodes)
            else:
                entries = episodes
            for offset in sorted(entries):
                if offset in episodes:
                    decisions[(partition, offset)] = memory.curate(offset, episodes[offset])
                else:
                    memory.observe(offset, entries[offset])
        return [decisions[(partition, offset)] for partition, offset, _ in batch]

    def committed(self) -> None:
        """The batch's episodes are in the table: the memories hold if that commit followed the version judged at."""
        written, judged_at = self.sink.written_version, self.judged_at
        self.version = written if None not in (written, judged_at) and written == judged_at + 1 else None
        self.judged_at = None

    def _rows(self, partition: int) -> list[dict]:
        """The partition's rows in `episodes` (HISTORY_COLUMNS)."""
        import pyarrow.compute as pc

        where = pc.field("kafka_partition") == partition
        return self.sink.read(HISTORY_COLUMNS, where, {"kafka_partition": (partition, partition)}).to_pylist()


def _judge(episode: EpisodeEvent, live: LiveSuccess) -> Curated | None:
    if episode.termination in NOT_THE_POLICY:
        return None
    rate = live.rate(episode.task)
    solved = rate is not None and rate >= SOLVED
    if episode.policy == "expert":
        if not episode.success:
            return None
        return (
            Curated("demo", 0.2, f"demonstration on a solved task ({rate:.2f})")
            if solved
            else Curated("demo", 1.0, "demonstration")
        )
    if episode.success:
        if solved:
            return Curated("success", 0.1, f"success on a solved task ({rate:.2f})")
        if rate is None or rate < HARD:
            return Curated("success", 2.0, "hard success" if rate is not None else "success, task not measured yet")
        return Curated("success", 1.0, "success")
    if episode.seed is not None and (episode.task, episode.seed) in live.solved_seeds:
        return Curated("failure", 2.0, "diverged from a success on the same seed")
    if episode.steps > 1 and episode.verification >= NEAR_MISS_VERIFIED:
        return Curated("failure", 1.5, "near miss")
    if solved:
        return Curated("failure", 1.5, f"failure on a solved task ({rate:.2f})")
    return Curated("failure", 0.5, "failure")
