"""Online RL: PPO on the fleet's sampled rollouts, per-step credit, with offline guidance (RefKL or DataBC).

A group is the rollouts of one task and seed (MiniWoB++ resets by seed, and an episode is deterministic
given its actions). Per-step credit (`step_credit_advantages`): each step's reward is the verify check (a
penalty when the screen did not do what the step expected) plus the episode's success at its last step;
its return G_t is discounted; a state is identified by its screen within the group, its value V(s) is the
mean return of the group's visits to it, and a step's advantage is Q(s_t, a_t) - V(s_t) with
Q = r_t + gamma * V(s_{t+1}), scaled by the spread of the group's episode returns. A correct first step
that every rollout took leads to one next screen whose value is the group's: advantage 0, not pushed down
with a failed episode's wrong last step. A one-step task's advantage is GRPO's.

The surrogate counts the action's tokens (after <act>): the thought is decoded greedily at the edge
(policy.sampling) and taught by SFT, and a KL to the SFT reference on the thought's tokens (`thought_kl`,
every update) keeps the shared decoder from carrying it off; RefKL and DataBC span every token.
Decoupled PPO: each token's ratio is taken against pi_old, the learner's own policy when the update began
(computed once, before its first step), and clipped; the behaviour log mu the edge recorded when it drew
the token (a tempered, top-k sampler, possibly an older version from the replay) only weights it,
min(pi_old / mu, ratio_cap):

    L = L_PPO + lambda_rel * L_relevance + kappa * KL_thought(pi_theta || pi_SFT)   (guidance "none")
    L = L_PPO + beta(n) * KL(pi_theta || pi_SFT) + ...   (RefKL, exact over the grammar's support)
    L = L_PPO + beta(n) * -log pi_theta(a_demo | s) + ...  (DataBC, on a batch of demonstrations)
    L = L_PPO + bc_weight * -log pi_theta(a_label | s) + ...  (anchor: demonstrations + teacher labels, a fixed
                                                               weight throughout, as CC-Net kept its BC term)

beta(n) = beta for `beta_warmup_env_steps` environment steps of online rollouts, then linearly to 0 over
`beta_anneal_env_steps` (Poyarkov, Staroverov and Panov, 2026, count them in environment steps; the caller
says how many the online stage has taken). L_relevance keeps the pruning relevance on the clicks of
successful rollouts (learner.model.vla_loss.target_patch_nll), as SFT does: the trunk under it moves.

One call is one PPO update over one batch of rollouts (`epochs` passes of minibatches, constant learning
rate); the optimizer state carries over between calls through the checkpoint in out_dir. Rows of groups
whose rollouts all scored alike carry no advantage and are skipped. The result's `diagnostics`: approximate
KL to pi_old and exact KL to SFT, clip fraction, entropy, ratio quantiles, informative share, beta.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import polars as pl
import torch

from learner.algorithms import distributed
from learner.algorithms.policy_logprobs import action_positions, grammar_masks, token_logprobs
from learner.algorithms.rl_losses import (
    databc_loss,
    entropy_over_support,
    guidance_beta,
    kl_to_reference,
    ppo_clip_loss,
    state_value_advantages,
    weigh_failures,
)
from learner.algorithms.training_run import VLAResult, open_run
from learner.daemon.daemon_config import Guidance
from learner.data.dataset import VLADataset
from learner.data.teacher_labels import teacher_agreement
from learner.model.checkpoints import load_vla
from learner.model.vla_loss import IGNORE, target_patch_nll
from learner.recipe import VLATrainConfig
from policy.pruning import keep_count


@dataclass(frozen=True)
class OnlineRLConfig:
    guidance: Guidance = "refkl"
    """Offline guidance: 'none' (plain PPO), 'refkl' (KL to the SFT reference), 'databc' (demo NLL, annealed) or
    'anchor' (NLL of the demonstrations and teacher labels at bc_weight, never annealed)."""
    beta: float = 0.1
    """beta_0 of the guidance term."""
    beta_warmup_env_steps: int = 4000
    """Environment steps of online rollouts at beta_0 before the anneal starts."""
    beta_anneal_env_steps: int = 12000
    """Environment steps over which beta then falls linearly to 0: at the ~1,500 own env steps a minute the
    curriculum's online rounds take here, beta is gone at ~16k, about half of a 21-minute online stage (the
    paper anneals over the first half of its environment steps too)."""
    clip: float = 0.2
    """PPO's epsilon."""
    ratio_cap: float = 5.0
    """The importance weight pi_old / mu is truncated here (stale behaviour versions, the sampler's tempering)."""
    epochs: int = 2
    """Passes over each rollout batch (fresh rollouts and the replay) ..."""
    minibatch_rows: int = 0
    """... in minibatches of about this many steps (0: the recipe's batch_size): Adam moves every weight by about
    the learning rate a step whatever the gradient, so a larger minibatch buys a less noisy direction per step."""
    thought_kl: float = 1.0
    """Weight of KL(pi_theta || pi_SFT) on the thought's tokens, every update, whatever the guidance: the
    surrogate trains the action, and without this anchor the shared decoder carried the greedy thought into
    babble ("A checkboxg checkboxg widget into it.") and ~4.5 nats a token from SFT over 190 updates."""
    target_kl: float = 0.02
    """... cut short when a minibatch's approximate KL(pi_old || pi_theta) on its action tokens passes 1.5x this
    (0: never): without it an update of ~18 steps moved the action tokens by a KL of 0.3-0.45 from pi_old
    (ratio 5 % quantile 0.1) and the policy away from SFT by ~2.8 nats a token within 17 updates."""
    negative_weight: float = 1.0
    """Share of a negative advantage applied (rl_losses.weigh_failures): 1 symmetric, 0 successes only."""
    demo_batch_size: int = 16
    """DataBC: demonstrations per minibatch."""
    gamma: float = 0.9
    """Discount of the per-step returns (a shorter success is worth more)."""
    verify_penalty: float = 0.1
    """Step reward of a step whose verify check failed (the screen did not do what the step expected): minus this."""
    bc_weight: float = 0.5
    """anchor: weight of the demonstrations' and teacher labels' NLL, the same at every update."""
    teacher_reward: float = 0.2
    """Step reward of a teacher-labelled step: this times (agreement - 0.5), agreement = action_score of the step's
    action against the label (1 the same, 0.5 its type, 0.1 another type; learner.data.teacher_labels)."""


def task_weights(recent: dict[str, list[bool]], window: int = 4, floor: float = 0.1) -> np.ndarray:
    """Dynamic sampling: one weight per task (in `recent`'s order), the share of its last `window` groups that
    were informative (rollouts that did not all end alike), at least `floor`; 1 for a task with no group yet."""
    return np.array([max(floor, float(np.mean(g[-window:]))) if g else 1.0 for g in recent.values()])


def step_credit_advantages(frame: pl.DataFrame, gamma: float, verify_penalty: float,
                           teacher_reward: float = 0.0) -> np.ndarray:  # fmt: skip
    """(M,) each step's advantage by per-step credit (module docstring), for `frame` in episode, step order.

    Columns: episode_id, step, task, seed, success, screenshot; verify_ok when recorded (else every step counts
    as verified); teacher_action_* when a teacher labelled steps (their agreement is a step reward)."""
    episodes = frame["episode_id"].to_list()
    ends = [i == len(episodes) - 1 or episodes[i + 1] != e for i, e in enumerate(episodes)]
    verified = frame["verify_ok"].fill_null(True).to_numpy() if "verify_ok" in frame.columns else np.ones(len(frame))
    success = frame["success"].cast(pl.Float64).to_numpy()
    rewards = -verify_penalty * (1.0 - verified.astype(np.float64)) + np.where(ends, success, 0.0)  # (M,)
    agreement = teacher_agreement(frame)  # (M,) NaN where no label
    rewards = rewards + teacher_reward * np.nan_to_num(agreement - 0.5)
    groups = [f"{t}\x00{s}" for t, s in zip(frame["task"].to_list(), frame["seed"].to_list(), strict=True)]
    screens = [hashlib.blake2b(png, digest_size=12).hexdigest() for png in frame["screenshot"].to_list()]
    # A state: the screen at a step index within a group (the same seed and the same screen: the same state).
    ids = {k: i for i, k in enumerate(dict.fromkeys(zip(groups, frame["step"].to_list(), screens, strict=True)))}
    states = np.array([ids[k] for k in zip(groups, frame["step"].to_list(), screens, strict=True)])
    group_ids = {g: i for i, g in enumerate(dict.fromkeys(groups))}
    return state_value_advantages(torch.from_numpy(rewards), torch.tensor(states), torch.tensor(ends),
                                  torch.tensor([group_ids[g] for g in groups]), gamma).numpy()  # fmt: skip


def on_labels(per_row: list[list[float]], labels: torch.Tensor, idx: np.ndarray) -> torch.Tensor:
    """(B, T): per_row[i], one value per generated token of row i, laid on the labelled positions of the
    batch row holding it (0 elsewhere)."""
    out = torch.zeros(labels.shape, dtype=torch.float32)
    for row, i in enumerate(idx):
        positions = torch.nonzero(labels[row] != IGNORE)[:, 0]
        values = torch.tensor(per_row[int(i)], dtype=torch.float32)
        if len(values) != len(positions):
            raise ValueError(f"row {int(i)}: {len(values)} log-probs for {len(positions)} tokens")
        out[row, positions] = values
    return out


def behaviour_logprobs(frame: pl.DataFrame, labels: torch.Tensor, idx: np.ndarray) -> torch.Tensor:
    """(B, T) the recorded log mu of each row's generated tokens, laid on its labelled positions (0 elsewhere)."""
    return on_labels(frame["token_logprobs"].to_list(), labels, idx)


@torch.no_grad()
def proximal_logprobs(model, data: VLADataset, tok, rows: np.ndarray, keep: int, batch_size: int) -> list:
    """log pi_old: the learner's own log-probs of each row's generated tokens before the update's first step
    (decoupled PPO's proximal policy). A list over the dataset's rows, each a list per token (None: not in
    `rows`)."""
    out: list = [None] * len(data)
    for chunk in np.array_split(rows, max(1, -(-len(rows) // batch_size))):
        batch = data.batch(chunk)
        logp, _, mask, _ = token_logprobs(model, batch, grammar_masks(tok, batch["labels"],
                                                                      model.cfg.max_thought_tokens), keep)  # fmt: skip
        for b, i in enumerate(chunk):
            out[int(i)] = logp[b][mask[b] > 0].tolist()
    return out


def relevance_targets(frame: pl.DataFrame) -> np.ndarray:
    """(M,) whether a row's click teaches the pruning relevance: a step of a successful rollout (or, in
    semi-online RL, a step that matched the expert's)."""
    for column in ("success", "matched"):
        if column in frame.columns:
            return frame[column].fill_null(False).to_numpy().astype(bool)
    return np.zeros(len(frame), dtype=bool)


def ppo_update(
    rollouts: pl.DataFrame,
    train: VLATrainConfig,
    rl: OnlineRLConfig,
    start_checkpoint: str | Path,
    reference_checkpoint: str | Path,
    out_dir: str | Path,
    demos: pl.DataFrame | None = None,
    env_steps: int = 0,
) -> VLAResult:
    """One PPO update on `rollouts` (SFT_COLUMNS + tokens, token_logprobs, task, seed, success, optionally
    verify_ok; or an `advantage` column per step instead of task, seed and success).

    Continues from out_dir's checkpoint (earlier updates), else starts from `start_checkpoint`; the
    reference (RefKL, and the KL diagnostic) is `reference_checkpoint`, the SFT model. `demos` (SFT_COLUMNS)
    feed DataBC. `env_steps`: environment steps the online stage had taken before these rollouts (beta's clock)."""
    if rl.guidance in ("databc", "anchor") and (demos is None or demos.is_empty()):
        raise ValueError(f"{rl.guidance} guidance needs demonstrations")
    run = open_run(out_dir, train, lambda: load_vla(start_checkpoint))
    model, tok, pruning, rng, optimizer = run.model, run.tok, run.pruning, run.rng, run.optimizer
    reference, _, _ = load_vla(reference_checkpoint)
    reference.requires_grad_(False)
    rollouts = rollouts.sort("episode_id", "step")  # the dataset's row order
    data = VLADataset(rollouts, tok, model.cfg, pruning)
    demo_data = VLADataset(demos, tok, model.cfg, pruning) if rl.guidance in ("databc", "anchor") else None
    # (M,) per-step credit, unless the caller computed an advantage per step (semi-online RL).
    given = "advantage" in rollouts.columns
    advantages = rollouts["advantage"].to_numpy().copy() if given else step_credit_advantages(
        rollouts, rl.gamma, rl.verify_penalty, rl.teacher_reward)  # fmt: skip
    advantages = weigh_failures(torch.from_numpy(advantages).float(), rl.negative_weight)
    teach = torch.from_numpy(relevance_targets(rollouts))
    keep = keep_count(model.cfg.num_patches, pruning.keep_ratio)
    beta = guidance_beta(env_steps, rl.beta, rl.beta_warmup_env_steps, rl.beta_anneal_env_steps)

    losses: list[float] = []
    stats = UpdateStats(clip=rl.clip)
    step = run.start_step
    model.train()
    run.begin()
    informative = np.flatnonzero(advantages.numpy() != 0)  # steps of groups whose rollouts differ
    old = proximal_logprobs(model, data, tok, informative, keep, train.batch_size) if len(informative) else []
    stopped_early = False
    for _ in range(rl.epochs if len(informative) else 0):
        if stopped_early:
            break
        rows_per_step = rl.minibatch_rows or train.batch_size
        for minibatch in np.array_split(rng.permutation(informative), max(1, len(informative) // rows_per_step)):
            chunk = distributed.local_rows(
                minibatch
            )  # this process's rows of the minibatch (learner.algorithms.distributed)
            batch = data.batch(chunk)
            masks = grammar_masks(tok, batch["labels"], model.cfg.max_thought_tokens)
            logp, logp_all, mask, relevance = token_logprobs(model, batch, masks, keep)  # (B, T), (B, T, V), (B, T)
            mu = behaviour_logprobs(rollouts, batch["labels"], chunk)  # (B, T)
            old_logp = on_labels(old, batch["labels"], chunk)  # (B, T)
            acted = mask * action_positions(batch["labels"], tok.act_id)  # (B, T) the surrogate's tokens
            kl = distributed.mean_over_processes(approx_kl(logp.detach(), old_logp, acted)) if rl.target_kl else 0.0
            if rl.target_kl and kl > 1.5 * rl.target_kl:  # decided alike on every process
                stopped_early = True  # this minibatch's policy is already too far from pi_old: no step on it
                break
            # Each term a mean over this process's tokens or rows, weighted into the global minibatch's
            # (distributed.share: 1 in one process).
            share = distributed.share
            total = ppo_clip_loss(logp, old_logp, mu, advantages[chunk], acted, rl.clip, rl.ratio_cap) * share(
                acted.sum()
            )
            targets = torch.where(teach[chunk], batch["target_patch"], torch.full_like(batch["target_patch"], -1))
            total = total + train.relevance_weight * target_patch_nll(relevance, targets) * share((targets >= 0).sum())
            with torch.no_grad():
                _, ref_logp_all, _, _ = token_logprobs(reference, batch, masks, keep)
            thought = mask - acted  # (B, T) the thought's tokens and <act>
            if rl.thought_kl > 0:
                total = total + rl.thought_kl * kl_to_reference(logp_all, ref_logp_all, thought) * share(thought.sum())
            if rl.guidance == "refkl" and beta > 0:
                total = total + beta * kl_to_reference(logp_all, ref_logp_all, mask) * share(mask.sum())
            elif rl.guidance in ("databc", "anchor") and (weight := beta if rl.guidance == "databc" else rl.bc_weight):
                demo_batch = demo_data.batch(distributed.local_rows(demo_data.sample(rng, rl.demo_batch_size)))
                demo_masks = grammar_masks(tok, demo_batch["labels"], model.cfg.max_thought_tokens)
                demo_logp, _, demo_mask, _ = token_logprobs(model, demo_batch, demo_masks, keep)
                total = total + weight * databc_loss(demo_logp, demo_mask) * share(demo_mask.sum())
            stats.add(logp, old_logp, logp_all, ref_logp_all, acted, thought)
            optimizer.zero_grad(set_to_none=True)
            total.backward()
            distributed.average_gradients(run.trainable)
            if train.grad_clip > 0:
                torch.nn.utils.clip_grad_norm_(model.parameters(), train.grad_clip)
            optimizer.step()
            losses.append(distributed.mean_over_processes(total.item()))
            step += 1
    result = run.finish(step, losses)
    groups = rollouts.select("task", "seed").n_unique() if {"task", "seed"} <= set(rollouts.columns) else None
    return replace(result, diagnostics=stats.summary() | {
        "beta": beta, "env_steps": env_steps, "rows": len(rollouts), "informative_rows": int(len(informative)),
        "informative_share": round(len(informative) / max(1, len(rollouts)), 4), "groups": groups,
        "optimizer_steps": len(losses), "stopped_early": stopped_early})  # fmt: skip


def approx_kl(logp: torch.Tensor, old_logp: torch.Tensor, mask: torch.Tensor) -> float:
    """k3 estimate of KL(pi_old || pi_theta) over the masked tokens: mean of (r - 1) - log r, r = pi_theta / pi_old."""
    log_ratio = (logp - old_logp)[mask > 0]
    return float((log_ratio.exp() - 1 - log_ratio).mean()) if log_ratio.numel() else 0.0


@dataclass
class UpdateStats:
    """Per-update diagnostics, accumulated over its minibatches (no gradient)."""

    clip: float
    ratios: list[torch.Tensor] = field(default_factory=list)  # pi_theta / pi_old at each counted token
    kl_old: list[float] = field(default_factory=list)
    kl_sft: list[float] = field(default_factory=list)
    kl_sft_thought: list[float] = field(default_factory=list)
    entropy: list[float] = field(default_factory=list)

    @torch.no_grad()
    def add(self, logp, old_logp, logp_all, ref_logp_all, acted, thought) -> None:
        on = acted > 0  # the ratios of the tokens the surrogate counts
        self.ratios.append((logp - old_logp)[on].exp())
        self.kl_old.append(approx_kl(logp, old_logp, acted))
        self.kl_sft.append(kl_to_reference(logp_all, ref_logp_all, acted).item())  # the action's tokens
        self.kl_sft_thought.append(kl_to_reference(logp_all, ref_logp_all, thought).item())
        self.entropy.append(entropy_over_support(logp_all, acted).item())

    def summary(self) -> dict:
        if not self.ratios:
            return {}
        ratios = torch.cat(self.ratios)
        q05, q50, q95 = (float(v) for v in torch.quantile(ratios, torch.tensor([0.05, 0.5, 0.95])))
        return {"kl_old": round(float(np.mean(self.kl_old)), 5), "kl_sft": round(float(np.mean(self.kl_sft)), 5),
                "kl_sft_thought": round(float(np.mean(self.kl_sft_thought)), 5),
                "entropy": round(float(np.mean(self.entropy)), 4),
                "clip_fraction": round(float(((ratios - 1).abs() > self.clip).float().mean()), 4),
                "ratio_q05": round(q05, 4), "ratio_q50": round(q50, 4), "ratio_q95": round(q95, 4)}  # fmt: skip
