"""The VLA's checkpoints on disk: a training checkpoint (model, tokenizer, pruning, optimiser, step, sampler
state; what a run resumes from), inference-only weights (what a release ships), and loading either."""

from __future__ import annotations

import os
from dataclasses import asdict
from pathlib import Path

import torch

from learner.model.lora import apply_lora, merge_lora
from learner.model.vla import VLA
from learner.model.vla_config import VLAConfig
from learner.recipe import VLATrainConfig
from policy.pruning import PruningConfig
from policy.tokens import ActionTokenizer

CHECKPOINT_NAME = "vla_checkpoint.pt"


def save_checkpoint(path: Path, model: VLA, tok: ActionTokenizer, optimizer, step: int, train: VLATrainConfig,
                    pruning: PruningConfig, rng_state: dict, sampler: dict | None = None) -> None:  # fmt: skip
    tmp = path.with_suffix(".tmp")
    torch.save(
        {
            "model_config": model.cfg.to_dict(),
            "model": model.state_dict(),
            "tokenizer": tok.to_json(),
            "pruning": asdict(pruning),
            "optimizer": optimizer.state_dict(),
            "step": step,
            "train_config": asdict(train),
            "rng": rng_state,
            "sampler": sampler or {},  # what the sampler learned as it went (TaskLossWeights), beside its rng
        },
        tmp,
    )
    os.replace(tmp, path)


def save_weights(path: Path, model: VLA, tok: ActionTokenizer, pruning: PruningConfig) -> Path:
    """Inference-only checkpoint (merged weights, tokenizer, pruning; no optimiser): what a release ships."""
    merged = merge_lora(model)
    torch.save(
        {"model_config": merged.cfg.to_dict(), "model": merged.state_dict(), "tokenizer": tok.to_json(),
         "pruning": asdict(pruning), "train_config": {"lora_rank": 0}},
        path,
    )  # fmt: skip
    return path


def resume_checkpoint(path: Path, config: VLATrainConfig) -> tuple[VLA, ActionTokenizer, PruningConfig, dict]:
    """A training checkpoint (save_checkpoint) as model (LoRA adapters re-applied), tokenizer, pruning and
    the raw state (optimizer, step, rng) to continue from."""
    state = torch.load(path, map_location="cpu", weights_only=True)
    model = VLA(VLAConfig.from_dict(state["model_config"]))
    if config.lora_rank:
        apply_lora(model, config.lora_rank, config.lora_alpha)
    model.load_state_dict(state["model"])
    return model, ActionTokenizer.from_json(state["tokenizer"]), PruningConfig(**state["pruning"]), state


def load_vla(path: str | Path) -> tuple[VLA, ActionTokenizer, PruningConfig]:
    """A trained VLA from a checkpoint (LoRA adapters merged), eval mode, on CPU."""
    state = torch.load(path, map_location="cpu", weights_only=True)
    model = VLA(VLAConfig.from_dict(state["model_config"]))
    rank = int(state["train_config"].get("lora_rank", 0))
    if rank:
        apply_lora(model, rank, float(state["train_config"]["lora_alpha"]))
    model.load_state_dict(state["model"])
    return merge_lora(model).eval(), ActionTokenizer.from_json(state["tokenizer"]), PruningConfig(**state["pruning"])
