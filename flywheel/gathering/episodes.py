"""The experiments' episodes as rows, as the pipeline would write and score them (processors.table_rows,
processors.scoring): the demonstrations, the logged fleet, the online rounds and every gathered round run through
the fleet's own loop (edge_client.episode) in a local browser; and the supervision the fleet's experience buys
beyond demonstrations, one (task, seed) at a time, as SFT rows a retrain reads (learner.algorithms.stages
"dagger" and "self_imitation"):

    continued_labels   DAgger whose labels fit their history: the teacher's own continuation from a greedy
                       failure's first disagreement, kept when it succeeds (edge_client.search.continue_by_teacher)
    dart_episode       the expert acting with noise, each state labelled with its clean action (edge_client.dart)
    search_episode     the successes a search from the policy's greedy failure finds (edge_client.search), the
                       teacher's steps alone where it finished one
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl

from core.console import say

COLUMNS = ["episode_id", "step", "task", "instruction", "screenshot", "thought", "action_type", "x", "y",
           "text", "key", "tokens", "token_logprobs", "seed", "model_version", "purpose", "weight", "score",
           "success", "target_box", "verify_ok", "temperature", "top_k", "teacher_action_type",
           "teacher_action_x", "teacher_action_y", "teacher_action_text", "teacher_action_key", "teacher_thought",
           "teacher_box"]  # fmt: skip


def episode_rows(result, episode_id: str, version: str) -> list[dict]:
    """The rows (COLUMNS) of one episode run by edge_client.episode, as the pipeline would write and score them."""
    from edge_client.runner import step_event
    from processors.scoring import EpisodeProgress, score_episode
    from processors.table_rows import step_row

    events = [step_event(r, "curriculum", episode_id, result.task, result.seed, version) for r in result.records]
    progress = EpisodeProgress()
    for event in events:
        progress.add(event)
    scored = score_episode(events[-1], progress)
    purpose = "demo" if version == "expert" else ("success" if scored.success else "failure")
    extra = {"purpose": purpose, "weight": 1.0, "score": scored.score, "success": scored.success}
    return [{k: v for k, v in step_row(e, 0, 0).items() if k in COLUMNS} | extra for e in events]


def to_frame(rows: list[dict]) -> pl.DataFrame:
    from learner.data.tables import ROLLOUT_TYPES

    types = ROLLOUT_TYPES | {"target_box": pl.List(pl.Float32), "verify_ok": pl.Boolean, "x": pl.Float64,
                             "y": pl.Float64, "score": pl.Float64, "weight": pl.Float64, "temperature": pl.Float64,
                             "top_k": pl.Int32, "teacher_action_type": pl.String, "teacher_action_x": pl.Float64,
                             "teacher_action_y": pl.Float64, "teacher_action_text": pl.String,
                             "teacher_action_key": pl.String, "teacher_thought": pl.String,
                             "teacher_box": pl.List(pl.Float32)}  # fmt: skip
    return pl.DataFrame(rows, schema_overrides=types, infer_schema_length=None).select(COLUMNS)


def run_episodes(env, policy_for, tasks, seeds, repeats: int, version: str, tag: str, max_steps: int, teacher=None):
    """(rows frame, env steps): every task x seed x repeat through the fleet's loop; `teacher` (edge_client.teacher)
    labels the screens its rule picks, as at the edge."""
    from edge_client.episode import run_episode

    rows, env_steps = [], 0
    for task in tasks:
        for seed in seeds:
            for r in range(repeats):
                result = run_episode(env, policy_for(task), task, seed, max_steps, teacher=teacher)
                env_steps += result.steps
                rows += episode_rows(result, f"{tag}-{task}-{seed}-{r}", version)
    return to_frame(rows), env_steps


def sampling_policy(model, tok, pruning, version: str, bundle: Path, temperature: float, top_k: int, seed: int):
    """The model exported to `bundle` and run by onnxruntime as at the edge, sampling."""
    from learner.model.export import export_bundle
    from policy.runtime import VLAPolicy
    from policy.sampling import Sampling

    export_bundle(model, tok, pruning, bundle)
    return VLAPolicy(bundle, version, sampling=Sampling(temperature, top_k, seed=seed))


def expert_trajectories(env, tasks: tuple[str, ...], episodes: int, seed: int, max_steps: int = 12) -> pl.DataFrame:
    """The experts' successful episodes on seeds seed .. seed + episodes - 1 of every task, as step rows
    (learner.algorithms.semi_online.TRAJECTORY_COLUMNS): the screens, actions and element boxes a model is matched
    on."""
    from edge_client.experts import expert_for
    from edge_client.tasks import task_name

    frames = []
    for task in tasks:
        frame, _ = run_episodes(env, expert_for, [task_name(task)], range(seed, seed + episodes), 1, "expert",
                                "sop", max_steps)  # fmt: skip
        frames.append(frame.filter(pl.col("success")))
    return pl.concat(frames)


def record_expert_trajectories(tasks: tuple[str, ...], episodes: int, seed: int) -> pl.DataFrame:
    """expert_trajectories in a browser of its own (opened and closed here): what SOP replays."""
    from edge_client.env import GuiEnv

    env = GuiEnv(tasks[0])
    try:
        say(f"sop: the experts record {episodes} trajectories per task on {len(tasks)} tasks")
        return expert_trajectories(env, tasks, episodes, seed)
    finally:
        env.close()


def continued_labels(env, policy, teacher, task: str, seed: int, version: str, max_steps: int):
    """DAgger with labels that fit their history: the policy's greedy episode, `teacher`
    (edge_client.teacher.Teacher) labelling by its rule; where it failed, from the first step whose label differs
    from the policy's action, the teacher's own continuation, kept only when that succeeds. Its rows: the replayed
    prefix as context (`train` false), the teacher's steps as labels. Returns (rows, env steps, teacher calls of
    the continuation)."""
    from edge_client.episode import run_episode
    from edge_client.experts import expert_for
    from edge_client.search import continue_by_teacher
    from learner.data.action_match import action_score

    episode = run_episode(env, policy, task, seed, max_steps, teacher=teacher)
    if episode.success:
        return pl.DataFrame(), episode.steps, 0
    differs = [r.step for r in episode.records if r.teacher is not None and
               action_score(r.decision.action, r.teacher.action, r.teacher.target_box) < 1.0]  # fmt: skip
    if not differs:
        return pl.DataFrame(), episode.steps, 0
    at = differs[0]
    continued = continue_by_teacher(env, policy, episode, at, expert_for(task), max_steps)
    if continued is None:
        return pl.DataFrame(), episode.steps, 0
    env_steps, calls = episode.steps + continued.steps, continued.steps - at
    if not continued.success:  # a label whose teacher continuation fails is dropped
        return pl.DataFrame(), env_steps, calls
    return label_rows(continued, f"{version}-{task}-{seed}-continued", version, at), env_steps, calls


def label_rows(result, episode_id: str, version: str, first_label: int) -> pl.DataFrame:
    """learner.data.teacher_labels' row shape (LABEL_COLUMNS) of an episode whose steps from `first_label` on are the
    teacher's: those are labels (`train`), the steps before them context; each step's history is what it took."""
    from learner.data.teacher_labels import LABEL_COLUMNS

    rows = to_frame(episode_rows(result, episode_id, version))
    taken = [pl.col(c).alias(f"taken_{c}") for c in ("action_type", "x", "y", "text", "key")]
    return rows.with_columns(*taken, (pl.col("step") >= first_label).alias("train")).select(LABEL_COLUMNS)


def dart_episode(env, task: str, seed: int, version: str, noise: float, sigma_px: float, rng: np.random.Generator,
                 max_steps: int):  # fmt: skip
    """One DART episode (edge_client.dart): the expert with its clicks displaced with probability `noise` by
    N(0, sigma_px^2), every state labelled with its clean action. Returns (teacher_rows, env steps)."""
    from edge_client.dart import NoisyExpert
    from edge_client.experts import expert_for
    from edge_client.teacher import Teacher, TeacherConfig
    from learner.data.teacher_labels import teacher_rows

    noisy = NoisyExpert(expert_for(task), noise, sigma_px, rng)
    # Every state labelled: the stateless expert's clean action on it (the call the noisy one made, not another).
    every_state = TeacherConfig(teacher_budget=max_steps, teacher_ask=("failing_task",), teacher_failing_below=2.0)
    rows, steps = run_episodes(env, lambda _t: noisy, [task], [seed], 1, "expert", version, max_steps,
                               Teacher(every_state, expert_for))  # fmt: skip
    return teacher_rows(rows), steps


def search_episode(env, policy, task: str, seed: int, version: str, budget, search_seed: int, max_steps: int):
    """The policy's greedy episode; where it fails, the search from it (edge_client.search, within `budget`; its
    teacher_calls > 0: the expert finishes branches). The successes found as label rows (label_rows: targets from
    SearchResult.targets_from; the greedy successes are not kept: they are what the policy already does).
    Returns (rows, env steps, figures with teacher_calls)."""
    from edge_client.episode import run_episode
    from edge_client.experts import expert_for
    from edge_client.search import search_failure

    episode = run_episode(env, policy, task, seed, max_steps)
    figures = {"episodes": 1, "failures": 0, "found": 0, "simulations": 0, "nondeterministic": 0, "teacher_calls": 0}
    if episode.success:
        return pl.DataFrame(), episode.steps, figures
    teacher = expert_for(task) if budget.teacher_calls else None
    found = search_failure(env, policy, episode, budget, seed=search_seed, teacher=teacher, max_steps=max_steps)
    stopped = int(found.stopped == "nondeterministic")
    figures |= {"failures": 1, "found": int(bool(found.successes)), "simulations": found.simulations,
                "teacher_calls": found.teacher_calls, "nondeterministic": stopped}  # fmt: skip
    # A success the policy finished is imitated whole; one the teacher finished, from the teacher's first step on
    # (its prefix, the policy's failure and a candidate, is context: imitated, it taught noops and wrong clicks).
    successes = enumerate(zip(found.successes, found.targets_from, strict=True))
    rows = [label_rows(result, f"{version}-{task}-{seed}-found-{k}", version, first) for k, (result, first) in
            successes]  # fmt: skip
    frame = pl.concat(rows) if rows else pl.DataFrame()
    return frame, episode.steps + found.env_steps, figures
