"""SFT of the VLA on demonstrations read from Delta: maximum likelihood of thought + action tokens.

Every batch: B steps sampled with replacement as `balance` says, or task-balanced click steps on a click-map
model's map-only steps (B is the global batch: under torchrun each process trains on its slice,
learner.algorithms.distributed), one keep ratio drawn from `keep_ratios`
(the model is trained with pruning on, and sees the unpruned screen too, so one set of weights serves
both edge variants), loss = learner.model.vla_loss.vla_loss. The run is a
learner.algorithms.training_run.TrainingRun: its checkpoints hold model, optimiser, sampler state and step, so a
killed run resumes where it stopped and ends with the same weights as an uninterrupted one.

LoRA (peft) adapters can replace full fine-tuning of the decoder for warm-started runs
(`lora_rank > 0`, learner.model.lora).
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable
from pathlib import Path

import polars as pl
import torch
from tqdm import tqdm

from learner.algorithms import distributed
from learner.algorithms.training_run import VLAProgress, VLAResult, lr_at, open_run
from learner.data.dataset import MAP_BALANCES, TaskLossWeights, VLADataset, tokenizer_corpus
from learner.model.checkpoints import load_vla
from learner.model.lora import apply_lora
from learner.model.vla import VLA
from learner.model.vla_config import VLAConfig
from learner.model.vla_loss import click_map_loss, click_map_nll, click_map_row_nll, vla_loss
from learner.recipe import VLARecipe, VLATrainConfig
from policy.pruning import PruningConfig, keep_count
from policy.tokens import ActionTokenizer, train_tokenizer


def train_vla(
    frame: pl.DataFrame,
    recipe: VLARecipe,
    out_dir: str | Path,
    *,
    init_checkpoint: str | Path | None = None,
    progress: Callable[[VLAProgress], None] | None = None,
    stop_at: int | None = None,
) -> VLAResult:
    """Train the VLA on `frame` (columns of learner.data.tables.SFT_COLUMNS) with `recipe.train` and write
    out_dir/vla_checkpoint.pt.

    Resumes from out_dir's checkpoint when there is one. Otherwise starts from `init_checkpoint` (its
    weights and tokenizer, fresh optimiser), else a fresh model of the recipe (`model`, `pruning`) with a
    tokenizer of `vocab_size` trained on the frame. Seeded: the same frame and recipe give the same weights
    on the same CPU, whether or not the run was interrupted (another CPU's kernels round differently: the
    weights of 1,200 steps differ, though evaluating one bundle gives the same episodes on both). `stop_at`:
    checkpoint and return after this step (a run sliced across sessions).
    """
    config = recipe.train

    def fresh() -> tuple[VLA, ActionTokenizer, PruningConfig]:
        if init_checkpoint is not None:
            model, tok, start_pruning = load_vla(init_checkpoint)
        else:
            torch.manual_seed(config.seed)
            tok = train_tokenizer(tokenizer_corpus(frame), vocab_size=recipe.vocab_size)
            start_pruning = recipe.pruning
            model = VLA(VLAConfig(**{**recipe.model, "vocab_size": tok.vocab_size, "bin_px": tok.bin_px}))
        if config.lora_rank:
            apply_lora(model, config.lora_rank, config.lora_alpha)
        return model, tok, start_pruning

    run = open_run(out_dir, config, fresh)
    model, tok, rng, optimizer = run.model, run.tok, run.rng, run.optimizer
    data, augmentation = VLADataset(frame, tok, model.cfg, run.pruning), config.augmentation
    map_weights = _map_task_weights(config, data, run.sampler)

    losses: list[float] = []
    model.train()
    net = distributed.wrap(model)  # the model itself outside torchrun
    run.begin()
    bar = tqdm(total=config.steps, initial=run.start_step, desc="vla sft", file=sys.stderr,
               disable=not (config.progress_bar and sys.stderr.isatty()))  # fmt: skip
    end = config.steps if stop_at is None else min(stop_at, config.steps)
    for step in range(run.start_step, end):
        lr = lr_at(step, config)
        for group in optimizer.param_groups:
            group["lr"] = lr
        keep = keep_count(model.cfg.num_patches, float(rng.choice(config.keep_ratios)))
        map_only = model.cfg.click_map and is_map_only_step(step, config.map_only_fraction)
        # Under torchrun every process draws the same global batch and trains on its slice
        # (learner.algorithms.distributed).
        task_weights = map_weights.probabilities() if map_only and map_weights is not None else None
        idx = data.sample(rng, config.batch_size, config.balance, clicks_only=map_only, task_weights=task_weights)
        batch = distributed.local_slice(data.batch(idx, rng, augmentation))
        if map_only:  # the encoder and its map alone: no decoder pass for steps with nothing to write
            _, _, click_map = net(batch["image"], None, batch["instruction_ids"], batch["instruction_chars"], None, 0)
            relevance_nll = click_map_nll(click_map, batch["positives"])
            total, token_nll = config.map_weight * relevance_nll, relevance_nll * 0.0
            if map_weights is not None:
                row_nll = click_map_row_nll(click_map.detach(), batch["positives"])  # (B,), +inf where no target
                map_weights.update(data.click_task_of[idx], row_nll.where(row_nll.isfinite(), torch.nan).numpy())
                run.sampler["map_task_nll"] = map_weights.nll.tolist()
        else:
            logits, relevance, click_map = net(batch["image"], batch["prior"], batch["instruction_ids"],
                                               batch["instruction_chars"], batch["text_ids"], keep)  # fmt: skip
            total, token_nll, relevance_nll = sft_loss(model, logits, relevance, click_map, batch, config)
        optimizer.zero_grad(set_to_none=True)
        total.backward()
        if config.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(run.trainable, config.grad_clip)
        optimizer.step()
        losses.append(total.item())
        done = step + 1
        bar.update(1)
        bar.set_postfix(loss=f"{losses[-1]:.3f}", tok=f"{token_nll.item():.3f}", rel=f"{relevance_nll.item():.2f}")
        if config.checkpoint_every and done % config.checkpoint_every == 0:
            run.save(done)
        if config.snapshot_every and done % config.snapshot_every == 0:
            run.save(done, run.out / "snapshots" / f"step-{done}.pt")
        if progress is not None and (done % config.log_every == 0 or done == config.steps):
            rate = len(losses) * config.batch_size / max(time.perf_counter() - run.started_wall, 1e-9)
            progress(VLAProgress(done, config.steps, losses[-1], token_nll.item(), relevance_nll.item(), lr, rate))
    bar.close()
    return run.finish(max(end, run.start_step), losses)


def _map_task_weights(config: VLATrainConfig, data: VLADataset, sampler: dict) -> TaskLossWeights | None:
    """map_balance "loss": the click tasks' weights, continued from the checkpoint's; None for "tasks"."""
    if config.map_balance not in MAP_BALANCES:
        raise ValueError(f"map_balance must be one of {MAP_BALANCES}, got {config.map_balance!r}")
    if config.map_balance == "tasks":
        return None
    if distributed.world()[1] > 1:  # each process would weigh its own slice's rows and draw other batches
        raise ValueError('map_balance "loss" trains on one process only')
    return TaskLossWeights(len(data.clicks_by_task), nll=sampler.get("map_task_nll"))


def is_map_only_step(step: int, fraction: float) -> bool:
    """Whether `step` trains the click map alone: `fraction` of the steps, spread evenly through the run (0.5:
    every other step), so the map keeps its task-balanced click batches while the full steps sample as they
    like (a first phase of map-only steps was forgotten by full steps drawn mostly from multi-step tasks)."""
    return math.floor((step + 1) * fraction) > math.floor(step * fraction)


def sft_loss(
    model: VLA,
    logits: torch.Tensor,
    relevance: torch.Tensor,
    click_map: torch.Tensor | None,
    batch: dict[str, torch.Tensor],
    config: VLATrainConfig,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(total, token NLL, click or relevance NLL) of a full forward pass: the click map's loss for a click-map
    model, else the pointer model's (learner.model.vla)."""
    if click_map is not None:
        return click_map_loss(logits, batch["labels"], click_map, batch["positives"], model.coordinate_ids,
                              config.map_weight)  # fmt: skip
    return vla_loss(logits, batch["labels"], relevance, batch["target_patch"], config.relevance_weight)
