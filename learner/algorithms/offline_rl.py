"""Offline RL: learn from every logged trajectory, successes and failures, without touching the environment.

Starting from the SFT model (also the frozen reference), each update is

    L = AWR + dpo_weight * DPO + lambda_rel * L_relevance                 (learner.algorithms.rl_losses)
    AWR: every logged step's tokens, weighted by w = curation weight * min(exp(A / tau), w_max),
         A = the episode's score (processors.scoring) minus the mean score of its task's logged episodes
    DPO: pairs (a success, a failure) of the same task and seed: the failure's trajectory log-ratio to the
         reference is pushed below the success's. Each trajectory's log-ratio is its mean per token (not the
         sum): a summed ratio over a few steps of ~10 tokens gave the DPO term ~35 in gradient norm against
         AWR's ~3 (a per-token mean), so the pairs swamped the imitation of everything logged
    L_relevance: the pruning relevance on the clicks of successful episodes (as SFT teaches it)

AWR alone only re-weights imitation (a failure's weight is small but positive); the DPO term is what
pushes probability away from the actions that led to dead ends. A model's rollout is scored on the
tokens it generated (recorded at the edge), a demonstration on its thought and action's tokenisation.
Checkpointed and resumable like SFT (learner.algorithms.training_run).
"""

from __future__ import annotations

import copy
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import polars as pl
import torch

from learner.algorithms import distributed
from learner.algorithms.policy_logprobs import grammar_masks, token_logprobs
from learner.algorithms.rl_losses import awr_loss, awr_weights, baseline_advantages, dpo_loss, episode_advantages
from learner.algorithms.training_run import VLAResult, lr_at, open_run
from learner.data.dataset import VLADataset
from learner.model.checkpoints import load_vla
from learner.model.vla import VLA
from learner.model.vla_loss import target_patch_nll
from learner.recipe import VLATrainConfig
from policy.pruning import keep_count

# Beyond learner.data.tables.SFT_COLUMNS: what the offline stage reads of each logged step.
ROLLOUT_COLUMNS = ["tokens", "seed", "score", "success", "weight"]


@dataclass(frozen=True)
class OfflineRLConfig:
    awr_temperature: float = 0.25
    """tau: advantages are score differences in [-1, 1]; 0.25 weighs a +0.5 episode e^2 above the task mean."""
    awr_max_weight: float = 5.0
    """w_max: no logged step weighs more than this."""
    dpo_beta: float = 1.0
    """beta of the DPO term on the per-token mean log-ratio (the margin saturates some nats a token from the
    reference)."""
    dpo_weight: float = 0.5
    """Weight of the DPO term against AWR (0: AWR only): at 0.5 its gradient is of AWR's norm on the tests'
    3-step trajectories (tests/test_offline_rl.py), where the summed ratio at beta 0.5 made it ~50x (126 vs 2.4)."""
    dpo_pairs: int = 4
    """(success, failure) pairs per update."""
    dpo_max_steps: int = 3
    """Steps of each trajectory scored in a pair: the first ones, where the two diverge from one screen."""


def step_advantages(frame: pl.DataFrame) -> np.ndarray:
    """(M,) each step's episode advantage: its score minus the mean score of its task's episodes."""
    return episode_advantages(frame, "score", ["task"], baseline_advantages)


def preference_pairs(frame: pl.DataFrame) -> list[tuple[str, str]]:
    """(success episode, failure episode) pairs of the same task and seed: the same start screen, so the two
    trajectories differ by what was done on it. A failure without a success on its seed gets no pair (a
    success on another seed answers another instruction and screen: no preference between them). The
    model's own successes are preferred over demonstrations as partners."""
    episodes = frame.unique("episode_id", keep="first", maintain_order=True)
    successes: dict[tuple, list[str]] = defaultdict(list)
    for row in episodes.filter(pl.col("success")).iter_rows(named=True):
        own = bool(row["tokens"])  # a model rollout (a demonstration records no tokens)
        key = (row["task"], row["seed"])
        successes[key].insert(0 if own else len(successes[key]), row["episode_id"])
    pairs = []
    for row in episodes.filter(~pl.col("success")).iter_rows(named=True):
        partners = successes.get((row["task"], row["seed"]))
        if partners:
            pairs.append((partners[0], row["episode_id"]))
    return pairs


def trajectory_logprobs(model: VLA, data: VLADataset, rows: list[int], segments: np.ndarray, keep: int) -> torch.Tensor:
    """(S,) mean log pi per token over each segment's tokens; rows (n,) dataset indices, segments (n,) segment ids."""
    batch = data.batch(np.array(rows))
    logp, _, mask, _ = token_logprobs(model, batch, grammar_masks(data.tok, batch["labels"],
                                                                  data.cfg.max_thought_tokens), keep)  # fmt: skip
    at = torch.from_numpy(segments)
    sums = torch.zeros(int(segments.max()) + 1, dtype=logp.dtype).index_add(0, at, logp.sum(1))  # (S,)
    tokens = torch.zeros(int(segments.max()) + 1, dtype=logp.dtype).index_add(0, at, mask.sum(1))  # (S,)
    return sums / tokens.clamp(min=1.0)


def train_offline_rl(
    frame: pl.DataFrame,
    train: VLATrainConfig,
    rl: OfflineRLConfig,
    init_checkpoint: str | Path,
    out_dir: str | Path,
    stop_at: int | None = None,
) -> VLAResult:
    """Offline RL from the SFT checkpoint `init_checkpoint` on `frame` (SFT_COLUMNS + ROLLOUT_COLUMNS).

    Resumes from out_dir's checkpoint; `stop_at`: checkpoint and return after this step."""
    reference, sft_tok, sft_pruning = load_vla(init_checkpoint)  # frozen: the DPO term's reference
    reference.requires_grad_(False)
    run = open_run(out_dir, train, lambda: (copy.deepcopy(reference).requires_grad_(True), sft_tok, sft_pruning))
    model, tok, pruning, rng, optimizer = run.model, run.tok, run.pruning, run.rng, run.optimizer
    frame = frame.sort("episode_id", "step")  # the dataset's row order
    data = VLADataset(frame, tok, model.cfg, pruning)
    weights = torch.from_numpy(frame["weight"].to_numpy().astype(np.float32)) * awr_weights(
        torch.from_numpy(step_advantages(frame)).float(), rl.awr_temperature, rl.awr_max_weight
    )  # (M,)
    teach = torch.from_numpy(frame["success"].fill_null(False).to_numpy().astype(bool))  # (M,) relevance targets
    rows_of: dict[str, list[int]] = defaultdict(list)
    for i, episode in enumerate(frame["episode_id"].to_list()):
        rows_of[episode].append(i)
    pairs = preference_pairs(frame) if rl.dpo_weight > 0 else []
    keep = keep_count(model.cfg.num_patches, pruning.keep_ratio)

    losses: list[float] = []
    model.train()
    run.begin()
    end = train.steps if stop_at is None else min(stop_at, train.steps)
    for step in range(run.start_step, end):
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step, train)
        # Every process draws the same global batch and trains on its rows (learner.algorithms.distributed).
        idx = distributed.local_rows(rng.integers(0, len(data), size=train.batch_size))
        batch = data.batch(idx)
        masks = grammar_masks(tok, batch["labels"], model.cfg.max_thought_tokens)
        logp, _, mask, relevance = token_logprobs(model, batch, masks, keep)  # (B, T), _, (B, T), (B, N)
        targets = torch.where(teach[idx], batch["target_patch"], torch.full_like(batch["target_patch"], -1))
        # Means over this process's tokens, rows and pairs, weighted into the global batch's
        # (learner.algorithms.distributed).
        share = distributed.share
        total = awr_loss(logp, weights[idx], mask) * share(mask.sum())
        total = total + train.relevance_weight * target_patch_nll(relevance, targets) * share((targets >= 0).sum())
        if pairs:  # DPO on this process's share of the drawn pairs (a process with none adds no term)
            drawn = rng.choice(len(pairs), size=min(rl.dpo_pairs, len(pairs)), replace=False)
            chosen = [pairs[j] for j in distributed.local_rows(drawn)]
            rows, segments = [], []
            for p, (win, lose) in enumerate(chosen):  # segment 2p: the success, 2p + 1: the failure
                for side, episode in ((0, win), (1, lose)):
                    steps = rows_of[episode][: rl.dpo_max_steps]
                    rows += steps
                    segments += [2 * p + side] * len(steps)
            pair_share = share(len(chosen))  # every process takes part, with pairs or without
            if rows:
                policy_lp = trajectory_logprobs(model, data, rows, np.array(segments), keep)  # (2P,)
                with torch.no_grad():
                    ref_lp = trajectory_logprobs(reference, data, rows, np.array(segments), keep)
                total = total + rl.dpo_weight * pair_share * dpo_loss(policy_lp[0::2], policy_lp[1::2], ref_lp[0::2],
                                                                      ref_lp[1::2], rl.dpo_beta)  # fmt: skip
        optimizer.zero_grad(set_to_none=True)
        total.backward()
        distributed.average_gradients(run.trainable)
        if train.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), train.grad_clip)
        optimizer.step()
        losses.append(distributed.mean_over_processes(total.item()))
        done = step + 1
        if train.checkpoint_every and done % train.checkpoint_every == 0:
            run.save(done)
    return run.finish(max(end, run.start_step), losses)
