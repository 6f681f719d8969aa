"""Supervised fine-tuning (behaviour cloning) of the pixel policy on expert / curated steps.

Loss over a batch of B steps i with weights w_i, action type a_i, target cell c_i, in-cell offset o_i and
m_i = 1 if a_i is positional (click, scroll):

    L = Σ_i w_i [ λ_type · −log p_θ(a_i|s_i) + λ_cell · m_i · −log p_θ(c_i|s_i) + λ_off · m_i · ‖ô_θ(c_i|s_i) − o_i‖₁ ]
        ──────────────────────────────────────────────────────────────────────────────────────────────────────
                                                      Σ_i w_i

p_θ(a|s) is a softmax over ACTION_TYPES, p_θ(c|s) a softmax over the G grid cells, ô_θ(c|s) the predicted offset
of the target cell (not of the argmax cell).
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import NamedTuple

import numpy as np
import polars as pl
import torch
import torch.nn.functional as F

from edge_client.preprocess import decode_png, encode_instruction, encode_target, screenshot_to_chw
from learner.model import PixelPolicy, PolicyConfig, PolicyOutput

CHECKPOINT_NAME = "checkpoint.pt"
REQUIRED_COLUMNS = ("screenshot", "instruction", "action_type", "x", "y")


@dataclass(frozen=True)
class SFTConfig:
    """Hyper-parameters of one SFT run."""

    steps: int = 2000
    """Total optimiser steps (a resumed run continues up to this count)."""

    batch_size: int = 32
    """Steps per batch, sampled uniformly with replacement from the frame."""

    lr: float = 2e-3
    """Peak AdamW learning rate."""

    weight_decay: float = 1e-4
    """AdamW decoupled weight decay."""

    warmup_steps: int = 50
    """Linear warm-up steps; afterwards cosine decay to `min_lr_ratio * lr` at `steps`."""

    min_lr_ratio: float = 0.1
    """Final learning rate as a fraction of `lr`."""

    grad_clip: float = 1.0
    """Clip the global gradient norm to this value (0 disables)."""

    type_loss_weight: float = 1.0
    """λ_type: weight of the action-type cross-entropy."""

    cell_loss_weight: float = 1.0
    """λ_cell: weight of the target-cell cross-entropy (positional actions only)."""

    offset_loss_weight: float = 0.5
    """λ_off: weight of the L1 in-cell offset regression (positional actions only)."""

    label_smoothing: float = 0.0
    """Label smoothing of both cross-entropies."""

    seed: int = 0
    """Seeds model init (fresh runs) and batch sampling."""

    num_threads: int = 2
    """torch intra-op threads (the learner box is a shared 2-core machine)."""

    log_every: int = 10
    """Call `progress` every this many steps (and on the last step)."""

    checkpoint_every: int = 0
    """Also write the checkpoint every this many steps (0: only at the end)."""


class SFTTargets(NamedTuple):
    action_type: torch.Tensor  # (B,) int64 index into ACTION_TYPES
    cell: torch.Tensor  # (B,) int64 row-major cell index (0 when not positional)
    offset: torch.Tensor  # (B, 2) float32 in-cell (dx, dy) in [0, 1)
    positional: torch.Tensor  # (B,) float32, 1 for click / scroll
    weight: torch.Tensor  # (B,) float32 sample weights w_i >= 0


class SFTLoss(NamedTuple):
    total: torch.Tensor  # () the weighted loss L above
    type_nll: torch.Tensor  # () weighted mean −log p(a_i)
    cell_nll: torch.Tensor  # () weighted mean −log p(c_i) over positional steps
    offset_l1: torch.Tensor  # () weighted mean ‖ô − o‖₁ over positional steps


def sft_loss(
    outputs: PolicyOutput,
    targets: SFTTargets,
    *,
    type_weight: float = 1.0,
    cell_weight: float = 1.0,
    offset_weight: float = 0.5,
    label_smoothing: float = 0.0,
) -> SFTLoss:
    """The SFT loss L of the module docstring. Pure: no state, no side effects."""
    w = targets.weight  # (B,)
    m = targets.positional  # (B,)
    norm = w.sum().clamp(min=1e-8)  # ()
    type_nll = F.cross_entropy(
        outputs.type_logits, targets.action_type, reduction="none", label_smoothing=label_smoothing
    )  # (B,)
    cell_nll = F.cross_entropy(
        outputs.cell_logits, targets.cell, reduction="none", label_smoothing=label_smoothing
    )  # (B,)
    idx = targets.cell[:, None, None].expand(-1, 1, 2)  # (B, 1, 2)
    pred_offset = outputs.cell_offsets.gather(1, idx).squeeze(1)  # (B, 2) offset predicted in the target cell
    offset_l1 = (pred_offset - targets.offset).abs().sum(-1)  # (B,)
    per_step = type_weight * type_nll + m * (cell_weight * cell_nll + offset_weight * offset_l1)  # (B,)
    pos_norm = (w * m).sum().clamp(min=1e-8)  # ()
    return SFTLoss(
        total=(w * per_step).sum() / norm,
        type_nll=(w * type_nll).sum() / norm,
        cell_nll=(w * m * cell_nll).sum() / pos_norm,
        offset_l1=(w * m * offset_l1).sum() / pos_norm,
    )


@dataclass(frozen=True)
class SFTProgress:
    """Passed to the progress callback every `log_every` steps."""

    step: int  # 1-based step just finished
    total_steps: int
    loss: float
    type_nll: float
    cell_nll: float
    lr: float
    samples_per_s: float  # since this call of train_sft started


@dataclass
class SFTResult:
    """Outcome of train_sft."""

    checkpoint_path: Path
    model: PixelPolicy = field(repr=False)  # the trained model, eval mode, on CPU
    start_step: int  # 0 for a fresh run, the checkpoint's step when resumed
    steps: int  # steps completed in total (== config.steps)
    losses: list[float]  # total loss per step run in this call
    type_nlls: list[float]
    cell_nlls: list[float]
    samples_per_s: float  # training throughput of this call (batch decode + forward + backward + step)
    wall_s: float
    num_parameters: int


class _Dataset:
    """The frame as arrays; screenshots stay PNG bytes and are decoded per batch (memory O(batch))."""

    def __init__(self, frame: pl.DataFrame, cfg: PolicyConfig):
        missing = [c for c in REQUIRED_COLUMNS if c not in frame.columns]
        if missing:
            raise ValueError(f"SFT frame lacks columns {missing}; has {frame.columns}")
        if frame.height == 0:
            raise ValueError("SFT frame is empty")
        self.png: list[bytes] = frame["screenshot"].to_list()
        self.ids = np.stack([encode_instruction(t or "", cfg.max_instruction_bytes) for t in frame["instruction"]])
        xs = frame["x"].cast(pl.Float64).fill_null(0.0).to_list()
        ys = frame["y"].cast(pl.Float64).fill_null(0.0).to_list()
        targets = [encode_target(a, x, y, cfg.grid) for a, x, y in zip(frame["action_type"], xs, ys, strict=True)]
        self.action_type = np.array([t.type_index for t in targets], dtype=np.int64)
        self.cell = np.array([t.cell for t in targets], dtype=np.int64)
        self.offset = np.array([t.offset for t in targets], dtype=np.float32)
        self.positional = np.array([t.positional for t in targets], dtype=np.float32)
        if "weight" in frame.columns:
            self.weight = frame["weight"].cast(pl.Float32).fill_null(1.0).to_numpy().astype(np.float32)
        else:
            self.weight = np.ones(frame.height, dtype=np.float32)
        if (self.weight < 0).any() or not np.isfinite(self.weight).all():
            raise ValueError("SFT weights must be finite and >= 0")

    def __len__(self) -> int:
        return len(self.png)

    def batch(self, idx: np.ndarray) -> tuple[torch.Tensor, torch.Tensor, SFTTargets]:
        images = np.stack([screenshot_to_chw(decode_png(self.png[i])) for i in idx])  # (B, 3, 210, 160) uint8
        targets = SFTTargets(
            action_type=torch.from_numpy(self.action_type[idx]),
            cell=torch.from_numpy(self.cell[idx]),
            offset=torch.from_numpy(self.offset[idx]),
            positional=torch.from_numpy(self.positional[idx]),
            weight=torch.from_numpy(self.weight[idx]),
        )
        return torch.from_numpy(images), torch.from_numpy(self.ids[idx]), targets


def lr_at(step: int, cfg) -> float:
    """Learning rate for 0-based `step`: linear warm-up, then cosine to min_lr_ratio * lr.

    `cfg` is any config with lr, warmup_steps, steps and min_lr_ratio (SFTConfig, VLATrainConfig)."""
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    progress = (step - cfg.warmup_steps) / max(1, cfg.steps - cfg.warmup_steps)
    cosine = 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))
    return cfg.lr * (cfg.min_lr_ratio + (1.0 - cfg.min_lr_ratio) * cosine)


def save_checkpoint(path: Path, model: PixelPolicy, optimizer, step: int, sft: SFTConfig, rng_state: dict) -> None:
    """Atomically write {"model_config", "model", "optimizer", "step", "sft_config", "rng"} to `path`."""
    tmp = path.with_suffix(".tmp")
    torch.save(
        {
            "model_config": model.cfg.to_dict(),
            "model": model.state_dict(),
            "optimizer": optimizer.state_dict(),
            "step": step,
            "sft_config": asdict(sft),
            "rng": rng_state,
        },
        tmp,
    )
    os.replace(tmp, path)


def train_sft(
    frame: pl.DataFrame,
    config: SFTConfig,
    out_dir: str | Path,
    *,
    model_config: PolicyConfig | None = None,
    init_model: PixelPolicy | None = None,
    resume_from: str | Path | None = None,
    progress: Callable[[SFTProgress], None] | None = None,
) -> SFTResult:
    """Train the pixel policy on `frame` and write `out_dir/checkpoint.pt`.

    frame columns: screenshot (PNG bytes), instruction (str), action_type (str in ACTION_TYPES), x, y (float
    pixels; ignored for non-positional types), weight (float, optional, default 1).
    Start from `resume_from` (a checkpoint: model, optimizer, step and sampler state; runs to config.steps),
    else from `init_model` (copied weights, fresh optimizer), else a fresh PixelPolicy(model_config) seeded
    with config.seed.
    """
    torch.set_num_threads(config.num_threads)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    ckpt_path = out / CHECKPOINT_NAME
    start_step, rng = 0, np.random.default_rng(config.seed)
    state = None
    if resume_from is not None:
        state = torch.load(resume_from, map_location="cpu", weights_only=True)
        saved = PolicyConfig.from_dict(state["model_config"])
        if model_config is not None and model_config != saved:
            raise ValueError(f"model_config {model_config} differs from the checkpoint's {saved}")
        model = PixelPolicy(saved)
        model.load_state_dict(state["model"])
        start_step = int(state["step"])
        rng.bit_generator.state = state["rng"]
    elif init_model is not None:
        model = PixelPolicy(init_model.cfg)
        model.load_state_dict(init_model.state_dict())
    else:
        torch.manual_seed(config.seed)
        model = PixelPolicy(model_config or PolicyConfig())
    data = _Dataset(frame, model.cfg)
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.lr, weight_decay=config.weight_decay)
    if state is not None:
        optimizer.load_state_dict(state["optimizer"])

    losses: list[float] = []
    type_nlls: list[float] = []
    cell_nlls: list[float] = []
    model.train()
    t0 = time.perf_counter()
    for step in range(start_step, config.steps):
        lr = lr_at(step, config)
        for group in optimizer.param_groups:
            group["lr"] = lr
        idx = rng.integers(0, len(data), size=config.batch_size)
        images, ids, targets = data.batch(idx)
        loss = sft_loss(
            model(images, ids),
            targets,
            type_weight=config.type_loss_weight,
            cell_weight=config.cell_loss_weight,
            offset_weight=config.offset_loss_weight,
            label_smoothing=config.label_smoothing,
        )
        optimizer.zero_grad(set_to_none=True)
        loss.total.backward()
        if config.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), config.grad_clip)
        optimizer.step()
        losses.append(loss.total.item())
        type_nlls.append(loss.type_nll.item())
        cell_nlls.append(loss.cell_nll.item())
        done = step + 1
        if config.checkpoint_every and done % config.checkpoint_every == 0 and done < config.steps:
            save_checkpoint(ckpt_path, model, optimizer, done, config, rng.bit_generator.state)
        if progress is not None and (done % config.log_every == 0 or done == config.steps):
            rate = len(losses) * config.batch_size / max(time.perf_counter() - t0, 1e-9)
            progress(SFTProgress(done, config.steps, losses[-1], type_nlls[-1], cell_nlls[-1], lr, rate))
    wall = time.perf_counter() - t0
    save_checkpoint(ckpt_path, model, optimizer, max(config.steps, start_step), config, rng.bit_generator.state)
    return SFTResult(
        checkpoint_path=ckpt_path,
        model=model.eval(),
        start_step=start_step,
        steps=max(config.steps, start_step),
        losses=losses,
        type_nlls=type_nlls,
        cell_nlls=cell_nlls,
        samples_per_s=len(losses) * config.batch_size / max(wall, 1e-9),
        wall_s=wall,
        num_parameters=model.num_parameters(),
    )
