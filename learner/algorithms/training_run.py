"""One resumable training run, what every stage (SFT, offline RL, online RL, semi-online) trains through.

`open_run` continues the run in a directory from its checkpoint (model, optimiser, seeded sampler, step) or
begins one; `TrainingRun.save` checkpoints it, `finish` returns the trained model as a `VLAResult`.
`lr_at` is the learning-rate schedule, `VLAProgress` what a run reports as it goes.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from learner.algorithms import distributed
from learner.model.checkpoints import CHECKPOINT_NAME, resume_checkpoint, save_checkpoint
from learner.model.lora import merge_lora
from learner.model.vla import VLA
from learner.recipe import VLATrainConfig
from policy.pruning import PruningConfig
from policy.tokens import ActionTokenizer


def lr_at(step: int, config: VLATrainConfig) -> float:
    """Learning rate for 0-based `step`: linear warm-up, then cosine to min_lr_ratio * lr."""
    if step < config.warmup_steps:
        return config.lr * (step + 1) / config.warmup_steps
    progress = (step - config.warmup_steps) / max(1, config.steps - config.warmup_steps)
    cosine = 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))
    return config.lr * (config.min_lr_ratio + (1.0 - config.min_lr_ratio) * cosine)


@dataclass(frozen=True)
class VLAProgress:
    step: int
    total_steps: int
    loss: float
    token_nll: float
    relevance_nll: float
    lr: float
    samples_per_s: float


@dataclass
class VLAResult:
    checkpoint_path: Path
    model: VLA = field(repr=False)
    tokenizer: ActionTokenizer = field(repr=False)
    pruning: PruningConfig
    start_step: int
    steps: int
    losses: list[float]
    samples_per_s: float
    wall_s: float
    cpu_s: float
    num_parameters: int
    diagnostics: dict = field(default_factory=dict)
    """What the stage reports of its update (learner.algorithms.stages): KLs, clip fraction, entropy, ..."""


@dataclass
class TrainingRun:
    """One resumable training run in its directory: the model it continues, its seeded sampler, its optimizer
    and step; every stage (SFT, offline RL, online RL) trains through one."""

    out: Path
    config: VLATrainConfig
    model: VLA
    tok: ActionTokenizer
    pruning: PruningConfig
    rng: np.random.Generator
    optimizer: torch.optim.Optimizer
    start_step: int
    sampler: dict = field(default_factory=dict)  # the sampler's state beyond its rng, saved with every checkpoint
    started_wall: float = field(default_factory=time.perf_counter)
    started_cpu: float = field(default_factory=time.process_time)

    @property
    def checkpoint_path(self) -> Path:
        return self.out / CHECKPOINT_NAME

    @property
    def trainable(self) -> list[torch.nn.Parameter]:
        return [p for p in self.model.parameters() if p.requires_grad]

    def begin(self) -> None:
        """Start the clocks (after the data is loaded: the figures are of training alone)."""
        self.started_wall, self.started_cpu = time.perf_counter(), time.process_time()

    def save(self, step: int, path: Path | None = None) -> None:
        """Checkpoint at `step` (rank 0 only under torchrun), to the run's checkpoint or `path`."""
        if distributed.is_main():
            (path or self.checkpoint_path).parent.mkdir(parents=True, exist_ok=True)
            save_checkpoint(path or self.checkpoint_path, self.model, self.tok, self.optimizer, step, self.config,
                            self.pruning, self.rng.bit_generator.state, self.sampler)  # fmt: skip

    def finish(self, steps: int, losses: list[float]) -> VLAResult:
        """The final checkpoint, and the trained model (LoRA merged, eval mode) with the run's figures."""
        wall, cpu = time.perf_counter() - self.started_wall, time.process_time() - self.started_cpu
        self.save(steps)
        distributed.barrier()
        return VLAResult(
            checkpoint_path=self.checkpoint_path,
            model=merge_lora(self.model).eval(),
            tokenizer=self.tok,
            pruning=self.pruning,
            start_step=self.start_step,
            steps=steps,
            losses=losses,
            samples_per_s=len(losses) * self.config.batch_size / max(wall, 1e-9),
            wall_s=wall,
            cpu_s=cpu,
            num_parameters=self.model.num_parameters(),
        )


def open_run(
    out_dir: str | Path, config: VLATrainConfig, start: Callable[[], tuple[VLA, ActionTokenizer, PruningConfig]]
) -> TrainingRun:
    """Continue the run in out_dir from its checkpoint (model, optimizer, sampler, step), or begin one from
    `start()` (a fresh or loaded model, its tokenizer and pruning) with a fresh optimizer."""
    torch.set_num_threads(config.num_threads)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(config.seed)
    state = None
    if (out / CHECKPOINT_NAME).exists():
        model, tok, pruning, state = resume_checkpoint(out / CHECKPOINT_NAME, config)
        rng.bit_generator.state = state["rng"]
    else:
        model, tok, pruning = start()
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=config.lr, weight_decay=config.weight_decay)
    if state is not None:
        optimizer.load_state_dict(state["optimizer"])
    step = int(state["step"]) if state is not None else 0
    sampler = dict(state.get("sampler") or {}) if state is not None else {}
    return TrainingRun(out, config, model, tok, pruning, rng, optimizer, step, sampler)
