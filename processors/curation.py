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
Cost: each batch of episodes reads eight narrow columns of the batch's tasks' rows in `episodes` (one row
per episode); a table of millions of episodes would want that history kept incrementally instead.
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


def curate_batch(batch: list[tuple[int, int, EpisodeEvent]], history: Iterable[dict]) -> list[Curated | None]:
    """The curation of each (partition, offset, episode) of a batch, judged on the episodes before it.

    `history`: rows (HISTORY_COLUMNS) of the `episodes` table for the batch's tasks; rows at or above an
    episode's offset are not its history (a redelivered batch finds itself in the table)."""
    entries: dict[tuple[int, int], dict] = {}
    for row in history:
        entries[(row["kafka_partition"], row["kafka_offset"])] = row
    judged = {}
    for partition, offset, episode in batch:
        entries[(partition, offset)] = {"episode_id": episode.episode_id, "task": episode.task, "seed": episode.seed,
                                        "success": episode.success, "policy": episode.policy,
                                        "termination": episode.termination}  # fmt: skip
        judged[(partition, offset)] = episode
    live: dict[int, LiveSuccess] = defaultdict(LiveSuccess)  # per partition: a task lives in one
    seen: set[str] = set()  # a re-emitted episode (scorer restart) counts once
    decisions: dict[tuple[int, int], Curated | None] = {}
    for key in sorted(entries):
        row = entries[key]
        if key in judged:
            decisions[key] = _judge(judged[key], live[key[0]])
        if row["termination"] not in NOT_THE_POLICY and row["episode_id"] not in seen:
            seen.add(row["episode_id"])
            live[key[0]].observe(row["task"], row["seed"], bool(row["success"]), row["policy"])
    return [decisions[(partition, offset)] for partition, offset, _ in batch]


def episode_history(sink, tasks: set[str]) -> list[dict]:
    """The `episodes` table's rows (HISTORY_COLUMNS) of `tasks`, at its newest version (sink: a DeltaSink)."""
    import pyarrow.compute as pc

    sink.refresh()
    return sink.read(HISTORY_COLUMNS, pc.field("task").isin(sorted(tasks)), {}).to_pylist()


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
