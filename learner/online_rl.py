"""Online RL: GRPO-style PPO on the fleet's sampled rollouts, with offline guidance (RefKL or DataBC).

A group is the rollouts of one task and seed (MiniWoB++ resets by seed), so the advantage of an episode is
its reward standardised within its group (learner.rl_losses.group_advantages) and every step of it shares
that advantage. Decoupled PPO: each token's ratio is taken against pi_old, the learner's own policy when the
update began (computed once, before its first step), and clipped; the behaviour log mu the edge recorded when
it drew the token (a tempered, top-k sampler, possibly an older version) only weights it, min(pi_old / mu,
ratio_cap):

    L = L_PPO                                           (guidance "none": plain PPO)
    L = L_PPO + beta(k) * KL(pi_theta || pi_SFT)        (RefKL, exact over the grammar's support)
    L = L_PPO + beta(k) * -log pi_theta(a_demo | s)     (DataBC, on a batch of demonstrations)

beta(k) = beta for `beta_warmup_steps` optimizer steps, then linearly to 0 over `beta_anneal_steps`
(Poyarkov, Staroverov and Panov, 2026). One call is one PPO update over one batch of rollouts
(`epochs` passes of minibatches, constant learning rate); the optimizer state and step count carry over
between calls through the checkpoint in out_dir, so beta's schedule and Adam's moments continue across
updates. Groups whose rollouts all scored alike carry no advantage and are skipped.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
import polars as pl
import torch

from learner.config import VLATrainConfig
from learner.policy_logprobs import grammar_masks, token_logprobs
from learner.rl_losses import (
    databc_loss,
    episode_advantages,
    group_advantages,
    guidance_beta,
    kl_to_reference,
    ppo_clip_loss,
)
from learner.vla_sft import VLADataset, VLAResult, load_vla, open_run
from policy.pruning import keep_count

Guidance = Literal["none", "refkl", "databc"]


@dataclass(frozen=True)
class OnlineRLConfig:
    guidance: Guidance = "refkl"
    """Offline guidance: 'none' (plain PPO), 'refkl' (KL to the SFT reference) or 'databc' (demo NLL)."""
    beta: float = 0.1
    """beta_0 of the guidance term."""
    beta_warmup_steps: int = 50
    """Optimizer steps at beta_0 before the anneal starts."""
    beta_anneal_steps: int = 150
    """Optimizer steps over which beta falls linearly to 0."""
    clip: float = 0.2
    """PPO's epsilon."""
    ratio_cap: float = 5.0
    """The importance weight pi_old / mu is truncated here (stale behaviour versions, the sampler's tempering)."""
    epochs: int = 2
    """Passes over each rollout batch."""
    demo_batch_size: int = 16
    """DataBC: demonstrations per minibatch."""


def episode_group_advantages(frame: pl.DataFrame) -> np.ndarray:
    """(M,) each step's advantage: its episode's success (1/0) standardised within its (task, seed) group."""
    return episode_advantages(frame, "success", ["task", "seed"], group_advantages)


def on_labels(per_row: list[list[float]], labels: torch.Tensor, idx: np.ndarray) -> torch.Tensor:
    """(B, T): per_row[i], one value per generated token of row i, laid on the labelled positions of the
    batch row holding it (0 elsewhere)."""
    out = torch.zeros(labels.shape, dtype=torch.float32)
    for row, i in enumerate(idx):
        positions = torch.nonzero(labels[row] != -100)[:, 0]
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
        logp, _, mask = token_logprobs(model, batch, grammar_masks(tok, batch["labels"], model.cfg.max_thought_tokens),
                                       keep)  # fmt: skip
        for b, i in enumerate(chunk):
            out[int(i)] = logp[b][mask[b] > 0].tolist()
    return out


def ppo_update(
    rollouts: pl.DataFrame,
    train: VLATrainConfig,
    rl: OnlineRLConfig,
    start_checkpoint: str | Path,
    reference_checkpoint: str | Path,
    out_dir: str | Path,
    demos: pl.DataFrame | None = None,
) -> VLAResult:
    """One PPO update on `rollouts` (SFT_COLUMNS + tokens, token_logprobs, task, seed, success; or an
    `advantage` column per step instead of task, seed and success).

    Continues from out_dir's checkpoint (earlier updates), else starts from `start_checkpoint`; the
    reference (RefKL) is `reference_checkpoint`, the SFT model. `demos` (SFT_COLUMNS) feed DataBC."""
    if rl.guidance == "databc" and (demos is None or demos.is_empty()):
        raise ValueError("DataBC guidance needs demonstrations")
    run = open_run(out_dir, train, lambda: load_vla(start_checkpoint))
    model, tok, pruning, rng, optimizer = run.model, run.tok, run.pruning, run.rng, run.optimizer
    reference = None
    if rl.guidance == "refkl":
        reference, _, _ = load_vla(reference_checkpoint)
        reference.requires_grad_(False)
    rollouts = rollouts.sort("episode_id", "step")  # the dataset's row order
    data = VLADataset(rollouts, tok, model.cfg, pruning)
    demo_data = VLADataset(demos, tok, model.cfg, pruning) if rl.guidance == "databc" else None
    # (M,) GRPO's per-episode advantage, unless the caller computed one per step (semi-online RL).
    given = "advantage" in rollouts.columns
    advantages = rollouts["advantage"].to_numpy().copy() if given else episode_group_advantages(rollouts)
    advantages = torch.from_numpy(advantages).float()
    keep = keep_count(model.cfg.num_patches, pruning.keep_ratio)

    losses: list[float] = []
    step = run.start_step
    model.train()
    run.begin()
    informative = np.flatnonzero(advantages.numpy() != 0)  # steps of groups whose rollouts differ
    old = proximal_logprobs(model, data, tok, informative, keep, train.batch_size) if len(informative) else []
    for _ in range(rl.epochs if len(informative) else 0):
        for chunk in np.array_split(rng.permutation(informative), max(1, len(informative) // train.batch_size)):
            batch = data.batch(chunk)
            masks = grammar_masks(tok, batch["labels"], model.cfg.max_thought_tokens)
            logp, logp_all, mask = token_logprobs(model, batch, masks, keep)  # (B, T), (B, T, V), (B, T)
            mu = behaviour_logprobs(rollouts, batch["labels"], chunk)  # (B, T)
            old_logp = on_labels(old, batch["labels"], chunk)  # (B, T)
            total = ppo_clip_loss(logp, old_logp, mu, advantages[chunk], mask, rl.clip, rl.ratio_cap)
            beta = guidance_beta(step, rl.beta, rl.beta_warmup_steps, rl.beta_anneal_steps)
            if rl.guidance == "refkl" and beta > 0:
                with torch.no_grad():
                    _, ref_logp_all, _ = token_logprobs(reference, batch, masks, keep)
                total = total + beta * kl_to_reference(logp_all, ref_logp_all, mask)
            elif rl.guidance == "databc" and beta > 0:
                demo_batch = demo_data.batch(rng.integers(0, len(demo_data), size=rl.demo_batch_size))
                demo_masks = grammar_masks(tok, demo_batch["labels"], model.cfg.max_thought_tokens)
                demo_logp, _, demo_mask = token_logprobs(model, demo_batch, demo_masks, keep)
                total = total + beta * databc_loss(demo_logp, demo_mask)
            optimizer.zero_grad(set_to_none=True)
            total.backward()
            if train.grad_clip > 0:
                torch.nn.utils.clip_grad_norm_(model.parameters(), train.grad_clip)
            optimizer.step()
            losses.append(total.item())
            step += 1
    return run.finish(step, losses)
