"""Supervision the fleet's experience buys: the teacher's labels of its own states (DAgger) and its verified
successes (self-imitation), as SFT rows, and the teacher's agreement as a dense step reward.

    teacher_rows         DAgger's aggregate. Every episode a teacher labelled, up to its last label: a labelled
                         step's target is the teacher's thought and action on the screen the policy saw; the
                         steps before it are context (`train` false), whose taken actions (`taken_*`) are the
                         history the labelled step's prompt holds, as it did at the edge.
    verified_successes   the fleet's successful episodes sampled greedily or from the policy's top-k (never a
                         temperature-1 draw over everything: what STaR, ReST-EM and Pix2Act keep), their own
                         thoughts and actions as targets.
    filtered_successes   filtered BC on the tasks nobody demonstrated: each (task, seed)'s shortest episode that the
                         environment verified, whatever temperature drew it (there the fleet explores widely,
                         edge_client.exploration; the verdict, not the draw, makes a success).
    teacher_agreement    (M,) how well each step's action agreed with the teacher's label of its screen
                         (learner.data.action_match.action_score: 1 the same, 0.5 its type, 0.1 another type), NaN
                         where no label was asked: online RL's step reward (UI-S1's, here online).

Both row kinds are trained with the demonstrations from the SFT model each round (learner.algorithms.stages "dagger" and
"self_imitation"), never by fine-tuning the drifting policy further.
"""

from __future__ import annotations

import numpy as np
import polars as pl

from core.object_store import Location
from lake.tables import EPISODES, STEPS, scan, table_uri
from learner.data.action_match import action_score, expert_action
from learner.data.tables import SFT_COLUMNS, table_versions

TEACHER_COLUMNS = ["teacher_action_type", "teacher_action_x", "teacher_action_y", "teacher_action_text",
                   "teacher_action_key", "teacher_thought", "teacher_box"]  # fmt: skip
_ACTION = ("action_type", "x", "y", "text", "key")
LABEL_COLUMNS = [*SFT_COLUMNS, "target_box", *(f"taken_{c}" for c in _ACTION), "train"]
_LABEL_TYPES = {"x": pl.Float64, "y": pl.Float64, "taken_x": pl.Float64, "taken_y": pl.Float64,
                "target_box": pl.List(pl.Float32), "train": pl.Boolean}  # fmt: skip


def teacher_rows(steps: pl.DataFrame | pl.LazyFrame) -> pl.DataFrame:
    """DAgger's rows (LABEL_COLUMNS, in episode and step order) from step rows with SFT_COLUMNS + TEACHER_COLUMNS."""
    lazy = steps.lazy()
    labelled = pl.col("teacher_action_type").is_not_null()
    last = lazy.filter(labelled).group_by("episode_id").agg(pl.col("step").max().alias("last_label"))

    def target(teacher: str, own: str) -> pl.Expr:
        return pl.when(labelled).then(pl.col(teacher)).otherwise(pl.col(own)).alias(own)

    return (
        lazy.join(last, on="episode_id", how="inner")
        .filter(pl.col("step") <= pl.col("last_label"))
        .select(
            "episode_id", "step", "task", "instruction", "screenshot", target("teacher_thought", "thought"),
            *(target(f"teacher_action_{c.removeprefix('action_')}", c).cast(_LABEL_TYPES.get(c, pl.String))
              for c in _ACTION),
            pl.when(labelled).then(pl.col("teacher_box").cast(pl.List(pl.Float32)))
            .otherwise(pl.lit([], dtype=pl.List(pl.Float32))).alias("target_box"),
            *(pl.col(c).cast(_LABEL_TYPES.get(f"taken_{c}", pl.String)).alias(f"taken_{c}") for c in _ACTION),
            labelled.alias("train"),
        )
        .sort("episode_id", "step")
        .collect()
    )  # fmt: skip


def empty_label_rows() -> pl.DataFrame:
    return pl.DataFrame(schema={c: _LABEL_TYPES.get(c, pl.Binary if c == "screenshot" else pl.String)
                                for c in LABEL_COLUMNS} | {"step": pl.Int32})  # fmt: skip


def label_count(rows: pl.DataFrame | None) -> int:
    """Teacher labels among DAgger's rows (the context rows are not labels; rows without a `train` column, an
    expert's new demonstrations, are labels every one)."""
    if rows is None or rows.is_empty():
        return 0
    return int(rows["train"].fill_null(True).sum()) if "train" in rows.columns else rows.height


def verified_successes(rows: pl.DataFrame, max_top_k: int) -> pl.DataFrame:
    """The steps (SFT_COLUMNS) of successful model episodes drawn greedily (temperature 0) or among the policy's
    `max_top_k` likeliest tokens; rows need success, model_version, temperature and top_k."""
    drawn_narrowly = (pl.col("temperature") == 0) | ((pl.col("top_k") > 0) & (pl.col("top_k") <= max_top_k))
    chosen = pl.col("success") & (pl.col("model_version") != "expert") & drawn_narrowly
    # An episode counts whole: every one of its steps was drawn alike, so one step's sampling decides.
    episodes = rows.filter(chosen)["episode_id"].unique()
    return rows.filter(pl.col("episode_id").is_in(episodes.implode())).select(SFT_COLUMNS).sort("episode_id", "step")


def filtered_successes(rows: pl.DataFrame, tasks: tuple[str, ...]) -> pl.DataFrame:
    """The steps (SFT_COLUMNS) of the shortest successful model episode of each (task, seed) of `tasks`; rows need
    seed, success and model_version. Ties go to the episode id first in order (a rerun keeps the same rows)."""
    model_successes = rows.filter(pl.col("task").is_in(list(tasks)) & pl.col("success")
                                  & (pl.col("model_version") != "expert"))  # fmt: skip
    shortest = (
        model_successes.group_by("task", "seed", "episode_id")
        .agg(pl.len().alias("steps"))
        .sort("steps", "episode_id")
        .unique(["task", "seed"], keep="first")["episode_id"]
    )
    return (
        model_successes.filter(pl.col("episode_id").is_in(shortest.implode()))
        .select(SFT_COLUMNS)
        .sort("episode_id", "step")
    )


def teacher_agreement(rows: pl.DataFrame) -> np.ndarray:
    """(M,) action_score of each row's action against its teacher label; NaN where the row has none."""
    if "teacher_action_type" not in rows.columns:
        return np.full(rows.height, np.nan)
    out = np.full(rows.height, np.nan)
    for i, row in enumerate(rows.select(*_ACTION, *TEACHER_COLUMNS).iter_rows(named=True)):
        if row["teacher_action_type"] is None:
            continue
        teacher = expert_action({c: row[f"teacher_action_{c.removeprefix('action_')}"] for c in _ACTION})
        out[i] = action_score(expert_action(row), teacher, row["teacher_box"] or None)
    return out


def load_teacher_labels(tables_dir: Location, versions: dict[str, int] | None = None) -> pl.DataFrame:
    """teacher_rows of the steps table at `versions` (pinned; empty before any step carried a label)."""
    steps = scan(table_uri(tables_dir, STEPS), version=(versions or table_versions(tables_dir))[STEPS])
    if "teacher_action_type" not in steps.collect_schema().names():
        return empty_label_rows()
    return teacher_rows(steps.select(*SFT_COLUMNS, *TEACHER_COLUMNS))


def load_verified_successes(
    tables_dir: Location, max_top_k: int, versions: dict[str, int] | None = None
) -> pl.DataFrame:
    """verified_successes of the steps table at `versions`, each episode's success read from `episodes`."""
    steps = scan(table_uri(tables_dir, STEPS), version=(versions or table_versions(tables_dir))[STEPS])
    if "temperature" not in steps.collect_schema().names():
        return pl.DataFrame(schema={c: pl.String for c in SFT_COLUMNS})
    episodes = scan(table_uri(tables_dir, EPISODES)).select("episode_id", "success")
    rows = steps.select(*SFT_COLUMNS, "model_version", "temperature", "top_k").join(episodes, on="episode_id")
    return verified_successes(rows.collect(), max_top_k)


def load_filtered_successes(tables_dir: Location, tasks: tuple[str, ...],
                            versions: dict[str, int] | None = None) -> pl.DataFrame:  # fmt: skip
    """filtered_successes of the steps table at `versions` on `tasks`, each episode's success read from `episodes`."""
    steps = scan(table_uri(tables_dir, STEPS), version=(versions or table_versions(tables_dir))[STEPS])
    if not tasks or "seed" not in steps.collect_schema().names():
        return pl.DataFrame(schema={c: pl.String for c in SFT_COLUMNS})
    episodes = scan(table_uri(tables_dir, EPISODES)).select("episode_id", "success")
    rows = (steps.filter(pl.col("task").is_in(list(tasks))).select(*SFT_COLUMNS, "model_version", "seed")
            .join(episodes, on="episode_id"))  # fmt: skip
    return filtered_successes(rows.collect(), tasks)
