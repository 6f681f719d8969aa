"""The learner's settings, torch-free (the CLI builds its flags from them without importing torch).

VLATrainConfig: the hyper-parameters of one SFT run; Augmentation: its training views' settings, what a
batch needs of them. VLARecipe: the model, pruning, vocabulary and training settings a run starts from, as
one JSON file. LearnConfig: one `flywheel sft` run.

configs/vla_demo.json (the demo's small VLA) and configs/vla_release.json (the release) are recipes; the
release's also lists its demonstrations. Every section is optional: what it leaves out keeps the defaults
of VLAConfig, PruningConfig and VLATrainConfig.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path

from policy.pruning import PruningConfig

CONFIGS = Path(__file__).resolve().parents[1] / "configs"


@dataclass(frozen=True)
class Augmentation:
    """How far a batch's random training views (learner.data.augment.random_view) may stray; all 0: none."""

    shift_px: int = 0
    """Largest random shift in pixels, each axis."""
    scale: float = 0.0
    """Largest relative zoom about the centre (0.08: 92 %-108 %)."""
    colour: float = 0.0
    """Largest per-channel gain deviation and offset (as a fraction of 255)."""

    @property
    def active(self) -> bool:
        return bool(self.shift_px or self.scale or self.colour)


@dataclass(frozen=True)
class VLATrainConfig:
    """Hyper-parameters of one VLA SFT run."""

    steps: int = 3000
    """Total optimiser steps (a resumed run continues up to this count)."""
    batch_size: int = 32
    """Demonstration steps per batch, sampled uniformly with replacement."""
    lr: float = 1e-3
    """Peak AdamW learning rate (linear warm-up, cosine to min_lr_ratio * lr)."""
    weight_decay: float = 0.01
    """AdamW weight decay."""
    warmup_steps: int = 100
    """Steps of the linear learning-rate warm-up."""
    min_lr_ratio: float = 0.05
    """The cosine schedule ends at this fraction of lr."""
    grad_clip: float = 1.0
    """Clip the gradient norm to this (0: no clipping)."""
    keep_ratios: tuple[float, ...] = (0.25, 0.25, 0.5, 1.0)
    """Each batch uses one of these visual-token keep ratios (uniformly drawn)."""
    relevance_weight: float = 0.5
    """λ_rel: weight of the target-patch NLL that teaches the pruning relevance (pointer models; a click-map
    model's relevance is its map's cell marginal, taught by map_weight)."""
    map_weight: float = 1.0
    """Click-map models (VLAConfig.click_map): weight of the click NLL over the target's element box."""
    map_only_fraction: float = 0.0
    """Click-map models: this fraction of a run's steps, spread evenly through it (0.5: every other step), train
    the encoder and its click map alone, on click steps (task-balanced), without the decoder's forward pass (3-4x
    cheaper); the rest train the whole model on batches drawn as `balance` says."""
    balance: str = "rows"
    """How full steps draw their batch: "rows" uniformly over steps (multi-step tasks fill the batches), "tasks"
    a task uniformly, then one of its steps, or "episodes" a task with probability proportional to its mean
    episode length, then one of its steps: every task's episodes are trained alike, step for step, so a
    five-step typing task gets five times a one-click task's decoder samples. Map-only steps draw their click
    steps as `map_balance` says, whatever this says."""
    map_balance: str = "tasks"
    """How map-only steps draw their click steps: "tasks" a click task uniformly, then one of its click steps, or
    "loss" a task with probability half uniform and half proportional to its running map NLL
    (learner.data.dataset.TaskLossWeights; kept in the checkpoint), so the map's samples go where it is still wrong
    rather than to tasks it already solves. One process only (its weights follow that process's rows)."""
    augment_shift_px: int = 0
    """Training views (learner.data.augment): largest random shift in pixels, each axis; 0: none."""
    augment_scale: float = 0.0
    """Training views: largest relative zoom about the centre (0.08: 92 %-108 %); 0: none."""
    augment_colour: float = 0.0
    """Training views: largest per-channel gain deviation and offset (as a fraction of 255); 0: none."""
    lora_rank: int = 0
    """> 0: train LoRA adapters of this rank on the decoder (base decoder frozen) instead of all its weights."""
    lora_alpha: float = 16.0
    """LoRA scaling alpha (with lora_rank > 0)."""
    seed: int = 0
    """Seeds batch sampling and a fresh model's initialisation."""
    num_threads: int = 2
    """torch intra-op threads."""
    log_every: int = 10
    """Report progress every this many steps (and at the end)."""
    checkpoint_every: int = 100
    """Write the checkpoint every this many steps (and at the end)."""
    snapshot_every: int = 0
    """Also keep the checkpoint of every this many steps as OUT/snapshots/step-N.pt (0: none): what a steps
    curve is evaluated from afterwards (`flywheel experiment --checkpoints`)."""
    progress_bar: bool = True
    """Show a tqdm progress bar on stderr when it is a terminal (a log file gets the periodic progress lines)."""

    @property
    def augmentation(self) -> Augmentation:
        """The augment_* settings, what VLADataset.batch draws its views with."""
        return Augmentation(self.augment_shift_px, self.augment_scale, self.augment_colour)


@dataclass(frozen=True)
class VLARecipe:
    model: dict = field(default_factory=dict)
    """VLAConfig fields of a fresh model (learner.model.vla); vocab_size and bin_px come from the tokenizer."""
    pruning: PruningConfig = field(default_factory=PruningConfig)
    vocab_size: int = 1024
    """Size of the locally trained tokenizer's vocabulary, action tokens included."""
    train: VLATrainConfig = field(default_factory=VLATrainConfig)
    raw: dict = field(default_factory=dict)
    """The whole JSON (sections other programs read, e.g. the release's demonstrations)."""

    @classmethod
    def load(cls, path: str | Path, **train_overrides) -> VLARecipe:
        """A recipe file, or a name of one in configs/ ('demo' -> configs/vla_demo.json); overrides that are
        None keep the recipe's value."""
        if not Path(path).suffix and (CONFIGS / f"vla_{path}.json").exists():
            path = CONFIGS / f"vla_{path}.json"
        raw = json.loads(Path(path).read_text())
        return cls.from_dict(raw, **train_overrides)

    @classmethod
    def from_dict(cls, raw: dict, **train_overrides) -> VLARecipe:
        train = dict(raw.get("train", {}))
        if "keep_ratios" in train:
            train["keep_ratios"] = tuple(train["keep_ratios"])
        if "seed" in raw:
            train.setdefault("seed", int(raw["seed"]))
        unknown = set(train) - set(VLATrainConfig.__dataclass_fields__)
        if unknown:
            raise ValueError(f"unknown train settings {sorted(unknown)} (VLATrainConfig has no such fields)")
        config = replace(VLATrainConfig(**train), **{k: v for k, v in train_overrides.items() if v is not None})
        return cls(model=dict(raw.get("model", {})), pruning=PruningConfig(**raw.get("pruning", {})),
                   vocab_size=int(raw.get("vocab_size", 1024)), train=config, raw=raw)  # fmt: skip


@dataclass
class LearnConfig:
    recipe: VLARecipe = field(default_factory=VLARecipe)
    """Model, pruning and vocabulary of a fresh VLA (no parent to warm-start from) and the training settings;
    `recipe.train.steps` is the step count of this run."""
    purposes: tuple[str, ...] = ("demo", "success")
    """training_samples purposes used by SFT: expert demonstrations and the fleet's own successes."""
    warm_start: bool = True
    """Continue from the newest published checkpoint when there is one."""
    min_samples: int = 8
    """Refuse to train on fewer samples (a broken pipeline, not a model to publish)."""
