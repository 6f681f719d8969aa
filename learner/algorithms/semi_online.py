"""Semi-online RL and SOP (UI-S1, arXiv 2509.11543): online-RL-style rollouts simulated on expert trajectories.

A rollout walks one expert trajectory: at step t the policy samples a thought + action on the expert's
screenshot t. When its action does not match the expert's, the patch module puts the expert's action in its
place and the rollout goes on from the expert's next screen; after `max_patches` patches the next mismatch
ends it. The mismatched sample stays in the batch with its low reward. No environment is touched.

The policy's history is its prompt's record of the episode's earlier actions (VLAConfig.history_actions):
its own where they matched, the expert's where a step was patched; each row keeps the exact prompt it was
sampled from (`prompt`), so the update scores the tokens under what the policy saw. The previous frame its
pruning prior reads is always the expert's. Rewards, returns and advantages: learner.algorithms.rl_losses
(semi_online_step_reward, semi_online_returns, semi_online_advantages, informative_groups).

Matching (learner.data.action_match): a click inside the expert target's element box (StepEvent.target_box), or near
its point when none was recorded; the same text, key or scroll direction.

SOP (semi-online performance): the greedy policy on each expert trajectory, stopping at its first mismatch;
progress = the fraction of steps it matched, success = it matched them all.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import polars as pl
import torch

from learner.algorithms.rl_losses import (
    informative_groups,
    semi_online_advantages,
    semi_online_returns,
    semi_online_step_reward,
)
from learner.data.action_match import action_matches, action_score, expert_action
from learner.data.augment import random_view
from policy.sampling import GREEDY, Sampling
from policy.screen import POSITIONAL_TYPES, decode_png, encode_png
from policy.tokens import ParseError
from schemas import Action

TRAJECTORY_COLUMNS = ["episode_id", "step", "task", "instruction", "screenshot", "action_type", "x", "y", "text",
                      "key", "target_box"]  # fmt: skip


@dataclass(frozen=True)
class SemiOnlineConfig:
    rollouts: int = 8
    """Sampled rollouts per expert trajectory (a group)."""
    trajectories: int = 16
    """Informative groups an update wants: trajectories are rolled out chunk by chunk (the next ones after the
    cursor) until this many groups are not flat, or every trajectory was tried once."""
    max_patches: int = 2
    """Mismatches patched with the expert's action per rollout; the next one ends the rollout."""
    discount: float = 0.5
    """γ of the step returns, G_t = r_t + γ G_{t+1}, cut at a patched mismatch (UI-S1's 0.5)."""
    min_group_std: float = 1e-6
    """Groups whose rollouts' step-0 returns spread no more than this (std) are dropped: nothing to rank.
    Any spread is kept: a one-step task's returns are 1.0 (the expert's click) or 0.55 (a click elsewhere),
    at most 0.225 apart in std, so the 0.3 of before dropped every such group."""
    rollout_temperature: float = 1.0
    """Sampling temperature of the rollouts (the fleet's own is EdgeConfig.temperature)."""
    top_k: int = 0
    """Rollouts sample among the k likeliest allowed tokens (0: all)."""
    kl_beta: float = 0.01
    """The small KL to the SFT reference that keeps the update near it (constant, never annealed)."""
    view_shift_px: int = 0
    """> 0: each trajectory's rollouts see it through one random view (learner.data.augment: shift up to this many
    pixels, zoom 1 +- view_scale, colour jitter view_colour), the expert's click and box moved with the
    pixels. A model that replays its own demonstrations exactly gives flat groups there; on a new view
    it does not. 0 with view_scale and view_colour 0: the recorded screens."""
    view_scale: float = 0.0
    view_colour: float = 0.0


def trajectories(frame: pl.DataFrame) -> list[list[dict]]:
    """Expert steps (TRAJECTORY_COLUMNS) grouped into trajectories, each in step order."""
    ordered = frame.sort("episode_id", "step")
    return [group.to_dicts() for _, group in ordered.group_by("episode_id", maintain_order=True)]


def act(runtime, tok, step: dict, previous: np.ndarray | None, history: list[Action], sampling: Sampling,
        rng) -> tuple:  # fmt: skip
    """(generation, parsed thought + action or None, well-formed 0/1, the screen) of the policy on an expert
    step's screen, with `history` its actions so far."""
    screen = decode_png(step["screenshot"])
    gen, _ = runtime.step(screen, step["instruction"], previous, sampling, rng, history)
    try:
        parsed = tok.parse(gen.ids)
    except ParseError:
        return gen, None, 0.0, screen
    return gen, parsed, float(bool(parsed.thought)), screen


def seen_through(steps: list[dict], view) -> list[dict]:
    """A trajectory's steps through an augment.View: screens warped, the expert's click point and box moved."""
    seen = []
    for step in steps:
        moved = {"screenshot": encode_png(view.apply(decode_png(step["screenshot"])))}
        if step["action_type"] in POSITIONAL_TYPES:
            moved["x"], moved["y"] = view.point(step["x"] or 0.0, step["y"] or 0.0)
        if step["target_box"]:
            left, top, right, bottom = step["target_box"]
            moved["target_box"] = [*view.point(left, top), *view.point(right, bottom)]
        seen.append(step | moved)
    return seen


def semi_online_rollouts(runtime, frame: pl.DataFrame, config: SemiOnlineConfig, seed: int) -> pl.DataFrame:
    """`config.rollouts` sampled rollouts of every expert trajectory in `frame`: one row per step taken, with
    the generated tokens and their log mu, the step reward and whether it matched. Columns: episode_id (the
    rollout), trajectory, step, task, instruction, screenshot, the sampled thought and action (SFT_COLUMNS'
    names), prompt (the ids it was sampled from, history included), tokens, token_logprobs, reward, matched."""
    tok = runtime.tok
    rng = np.random.default_rng(seed)
    sampling = Sampling(config.rollout_temperature, config.top_k, seed=seed)
    rows = []
    viewed = bool(config.view_shift_px or config.view_scale or config.view_colour)
    for steps in trajectories(frame):
        if viewed:
            first_click = next(((s["x"], s["y"]) for s in steps if s["action_type"] in POSITIONAL_TYPES), None)
            view = random_view(rng, config.view_shift_px, config.view_scale, config.view_colour, first_click)
            steps = seen_through(steps, view)
        for r in range(config.rollouts):
            patches, previous, history = 0, None, []
            for step in steps:
                gen, parsed, well_formed, screen = act(runtime, tok, step, previous, history, sampling, rng)
                action = parsed.action if parsed else Action(type="noop")
                expert = expert_action(step)
                score = action_score(parsed and parsed.action, expert, step["target_box"])
                rows.append({"episode_id": f"{step['episode_id']}-so{r}", "trajectory": step["episode_id"],
                             "step": step["step"], "task": step["task"], "instruction": step["instruction"],
                             "screenshot": step["screenshot"], "thought": parsed.thought if parsed else "",
                             "action_type": action.type, "x": action.x, "y": action.y, "text": action.text,
                             "key": action.key, "prompt": runtime.prompt(step["instruction"], history),
                             "tokens": list(gen.ids), "token_logprobs": list(gen.token_logprobs),
                             "reward": float(semi_online_step_reward(torch.tensor(well_formed), torch.tensor(score))),
                             "matched": score == 1.0})  # fmt: skip
                previous = screen
                # The patch module: a mismatched action is replaced by the expert's in the history.
                history.append(action if score == 1.0 else expert)
                if score < 1.0:
                    patches += 1
                    if patches > config.max_patches:
                        break
    types = {"prompt": pl.List(pl.Int32), "tokens": pl.List(pl.Int32), "token_logprobs": pl.List(pl.Float32)}
    return pl.DataFrame(rows, schema_overrides=types)


def rollout_advantages(rows: pl.DataFrame, config: SemiOnlineConfig) -> np.ndarray:
    """(M,) the advantage of every row of semi_online_rollouts: step term over (trajectory, step index),
    episode term over the trajectory's rollouts; 0 for rows of dropped groups (they are not trained on)."""
    rows = rows.with_row_index("row")
    returns = np.zeros(rows.height, dtype=np.float32)
    totals = np.zeros(rows.height, dtype=np.float32)
    first_returns, first_groups = [], []
    for _, rollout in rows.group_by("episode_id", maintain_order=True):
        rollout = rollout.sort("step")
        g = semi_online_returns(torch.tensor(rollout["reward"].to_numpy(), dtype=torch.float32),
                                torch.tensor(rollout["matched"].to_numpy()), config.discount)  # fmt: skip
        index = rollout["row"].to_numpy()
        returns[index], totals[index] = g.numpy(), float(rollout["reward"].sum())
        first_returns.append(float(g[0]))
        first_groups.append(rollout["trajectory"][0])
    trajectory_ids = {name: i for i, name in enumerate(dict.fromkeys(rows["trajectory"].to_list()))}
    traj = torch.tensor([trajectory_ids[t] for t in rows["trajectory"].to_list()])
    step_groups = traj * 10_000 + torch.tensor(rows["step"].to_numpy())
    advantages = semi_online_advantages(torch.from_numpy(returns), step_groups, torch.from_numpy(totals), traj)
    kept = informative_groups(torch.tensor(first_returns), torch.tensor([trajectory_ids[g] for g in first_groups]),
                              config.min_group_std)  # fmt: skip
    return torch.where(torch.isin(traj, kept), advantages, torch.zeros_like(advantages)).numpy()


def sop(runtime, frame: pl.DataFrame) -> dict:
    """Semi-online performance of the greedy policy on the expert trajectories in `frame`:
    {"tasks": {task: {"sop_progress", "sop_success", "trajectories"}}, "sop_progress", "sop_success"}
    (the means over tasks, unweighted as the tier means are)."""
    per_task: dict[str, list[tuple[float, bool]]] = {}
    for steps in trajectories(frame):
        matched, previous, history = 0, None, []
        for step in steps:
            _, parsed, _, screen = act(runtime, runtime.tok, step, previous, history, GREEDY, None)
            if parsed is None or not action_matches(parsed.action, expert_action(step), step["target_box"]):
                break
            matched, previous = matched + 1, screen
            history.append(parsed.action)
        per_task.setdefault(steps[0]["task"], []).append((matched / len(steps), matched == len(steps)))
    tasks = {
        task: {"sop_progress": float(np.mean([p for p, _ in runs])),
               "sop_success": float(np.mean([s for _, s in runs])), "trajectories": len(runs)}
        for task, runs in per_task.items()
    }  # fmt: skip
    return {
        "tasks": tasks,
        "sop_progress": float(np.mean([t["sop_progress"] for t in tasks.values()])) if tasks else 0.0,
        "sop_success": float(np.mean([t["sop_success"] for t in tasks.values()])) if tasks else 0.0,
    }


def interleaved(frame: pl.DataFrame) -> list[str]:
    """The frame's episodes, task by task in turn (a chunk of them spans the tasks)."""
    by_task: dict[str, list[str]] = {}
    for episode, task in frame.select("episode_id", "task").unique(maintain_order=True).iter_rows():
        by_task.setdefault(task, []).append(episode)
    columns = list(by_task.values())
    return [c[i] for i in range(max(map(len, columns), default=0)) for c in columns if i < len(c)]


def semi_online_update(expert: pl.DataFrame, train, config: SemiOnlineConfig, start_checkpoint, reference_checkpoint,
                       out_dir, seed: int = 0, cursor: int = 0):  # fmt: skip
    """One semi-online RL update: rollouts of the current model (out_dir's, else start_checkpoint's) over the
    expert trajectories in `expert` (TRAJECTORY_COLUMNS), from the `cursor`-th on (tasks interleaved, cyclic),
    refilled until `config.trajectories` groups are informative or every trajectory was tried once; their
    advantages; one PPO update with a constant small KL to the SFT reference. Returns (VLAResult, {"rollout_steps",
    "matched", "trained_steps", "groups_tried", "groups_informative", "cursor"})."""
    from learner.algorithms import distributed
    from learner.algorithms.online_rl import OnlineRLConfig, ppo_update
    from learner.model.checkpoints import CHECKPOINT_NAME, load_vla
    from learner.model.export import export_bundle
    from policy.runtime import VLARuntime

    out = Path(out_dir)
    current = out / "ppo" / CHECKPOINT_NAME
    model, tok, pruning = load_vla(current if current.exists() else start_checkpoint)
    bundle = out / "rollouts.vla"
    if distributed.is_main():  # under torchrun one process writes it; every process samples the same rollouts
        export_bundle(model, tok, pruning, bundle)
    distributed.barrier()
    runtime = VLARuntime(bundle)
    episodes = interleaved(expert)
    batches, informative, tried = [], 0, 0
    while informative < config.trajectories and tried < len(episodes):
        take = [episodes[(cursor + tried + i) % len(episodes)]
                for i in range(min(config.trajectories - informative, len(episodes) - tried))]  # fmt: skip
        rows = semi_online_rollouts(runtime, expert.filter(pl.col("episode_id").is_in(take)), config, seed + tried)
        rows = rows.with_columns(pl.Series("advantage", rollout_advantages(rows, config)))
        informative += rows.filter(pl.col("advantage") != 0)["trajectory"].n_unique()
        tried += len(take)
        batches.append(rows)
    rows = pl.concat(batches)
    # Constant beta: a warm-up longer than any run, so the KL term never anneals away.
    rl = OnlineRLConfig(guidance="refkl", beta=config.kl_beta, beta_warmup_env_steps=10**12)
    result = ppo_update(rows, train, rl, start_checkpoint, reference_checkpoint, out / "ppo")
    stats = {"rollout_steps": rows.height, "matched": float(rows["matched"].mean()),
             "trained_steps": int((rows["advantage"] != 0).sum()), "groups_tried": tried,
             "groups_informative": informative, "cursor": (cursor + tried) % max(1, len(episodes))}  # fmt: skip
    return result, stats
