"""SFT of the VLA on demonstrations read from Delta: maximum likelihood of thought + action tokens.

Every batch: B steps sampled uniformly with replacement, one keep ratio drawn from `keep_ratios`
(the model is trained with pruning on, and sees the unpruned screen too, so one set of weights serves
both edge variants), loss = learner.vla.vla_loss. Checkpoints hold model, optimiser, sampler state and
step, so a killed run resumes where it stopped and ends with the same weights as an uninterrupted one.

LoRA (peft) adapters can replace full fine-tuning of the decoder for warm-started runs
(`lora_rank > 0`); `merge_lora` folds them into the weights before export.
"""

from __future__ import annotations

import math
import os
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import polars as pl
import torch
from tqdm import tqdm

from learner.config import VLATrainConfig
from learner.vla import IGNORE, VLA, VLAConfig, target_patch_index, vla_loss
from policy.pruning import PruningConfig, keep_count, patch_prior
from policy.screen import POSITIONAL_TYPES, decode_png, screenshot_to_chw
from policy.tokens import ActionTokenizer, short_thought, train_tokenizer
from schemas import Action

CHECKPOINT_NAME = "vla_checkpoint.pt"


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


class VLADataset:
    """Demonstration steps, decoded once: screenshots (M, 3, 210, 160) uint8, pruning priors, token sequences."""

    def __init__(self, frame: pl.DataFrame, tok: ActionTokenizer, cfg: VLAConfig, pruning: PruningConfig):
        frame = frame.sort("episode_id", "step")
        screens = [decode_png(png) for png in frame["screenshot"]]
        self.images = np.stack([screenshot_to_chw(s) for s in screens])
        previous = _previous_frames(frame["episode_id"].to_list(), frame["step"].to_list(), screens)
        pairs = zip(screens, previous, strict=True)
        self.priors = np.stack([patch_prior(s, p, cfg.patch_px, pruning) for s, p in pairs])  # (M, N)
        self.instruction: list[list[int]] = []
        self.text: list[list[int]] = []  # prompt + target
        self.prompt_len: list[int] = []
        self.target_patch = np.full(frame.height, -1, dtype=np.int64)
        for i, row in enumerate(frame.iter_rows(named=True)):
            action = Action(row["action_type"], x=row["x"] or 0.0, y=row["y"] or 0.0, text=row["text"] or "",
                            key=row["key"] or "")  # fmt: skip
            prompt = tok.prompt_ids(row["instruction"] or "", cfg.max_instruction_tokens)
            target = tok.target_ids(row["thought"] or "", action, cfg.max_thought_tokens)
            self.instruction.append(prompt[1:-1])
            self.text.append(prompt + target)
            self.prompt_len.append(len(prompt))
            if action.type in POSITIONAL_TYPES:
                self.target_patch[i] = target_patch_index(action.x, action.y, cfg.patch_px)
        self.max_text = max(len(t) for t in self.text)

    def __len__(self) -> int:
        return len(self.text)

    def batch(self, idx: np.ndarray) -> dict[str, torch.Tensor]:
        texts = [self.text[i] for i in idx]
        width = max(len(t) for t in texts)
        text_ids = np.zeros((len(idx), width), dtype=np.int64)
        labels = np.full((len(idx), width), IGNORE, dtype=np.int64)
        instruction = np.zeros((len(idx), max(1, max(len(self.instruction[i]) for i in idx))), dtype=np.int64)
        for row, i in enumerate(idx):
            text_ids[row, : len(self.text[i])] = self.text[i]
            labels[row, self.prompt_len[i] : len(self.text[i])] = self.text[i][self.prompt_len[i] :]
            instruction[row, : len(self.instruction[i])] = self.instruction[i]
        return {
            "image": torch.from_numpy(self.images[idx]),
            "prior": torch.from_numpy(self.priors[idx]),
            "instruction_ids": torch.from_numpy(instruction),
            "text_ids": torch.from_numpy(text_ids),
            "labels": torch.from_numpy(labels),
            "target_patch": torch.from_numpy(self.target_patch[idx]),
        }


def _previous_frames(episodes: list[str], steps: list[int], screens: list[np.ndarray]) -> list[np.ndarray | None]:
    """The screenshot of the same episode's previous step, or None (first step, or that step not in the frame)."""
    index = {(e, s): i for i, (e, s) in enumerate(zip(episodes, steps, strict=True))}
    previous = [index.get((e, s - 1)) for e, s in zip(episodes, steps, strict=True)]
    return [screens[j] if j is not None else None for j in previous]


def tokenizer_corpus(frame: pl.DataFrame) -> list[str]:
    """What the BPE is trained on: instructions, short thoughts, typed text and key names of the demonstrations."""
    texts = [t for t in frame["instruction"].unique().to_list() if t]
    texts += [short_thought(t) for t in frame["thought"].to_list() if t]
    texts += [t for t in frame["text"].to_list() + frame["key"].to_list() if t]
    return texts


def apply_lora(model: VLA, rank: int, alpha: float) -> VLA:
    """Wrap the decoder with LoRA adapters on attention and MLP projections; freezes the base decoder."""
    from peft import LoraConfig, get_peft_model

    lora = LoraConfig(r=rank, lora_alpha=alpha, target_modules=["c_attn", "c_proj", "c_fc"], fan_in_fan_out=True)
    model.decoder = get_peft_model(model.decoder, lora)
    return model


def merge_lora(model: VLA) -> VLA:
    """Fold LoRA adapters into the decoder weights (a plain GPT2LMHeadModel again); no-op without adapters."""
    if hasattr(model.decoder, "merge_and_unload"):
        model.decoder = model.decoder.merge_and_unload()
    return model


def save_checkpoint(path: Path, model: VLA, tok: ActionTokenizer, optimizer, step: int, train: VLATrainConfig,
                    pruning: PruningConfig, rng_state: dict) -> None:  # fmt: skip
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


def load_vla(path: str | Path) -> tuple[VLA, ActionTokenizer, PruningConfig]:
    """A trained VLA from a checkpoint (LoRA adapters merged), eval mode, on CPU."""
    state = torch.load(path, map_location="cpu", weights_only=True)
    model = VLA(VLAConfig.from_dict(state["model_config"]))
    rank = int(state["train_config"].get("lora_rank", 0))
    if rank:
        apply_lora(model, rank, float(state["train_config"]["lora_alpha"]))
    model.load_state_dict(state["model"])
    return merge_lora(model).eval(), ActionTokenizer.from_json(state["tokenizer"]), PruningConfig(**state["pruning"])


def train_vla(
    frame: pl.DataFrame,
    config: VLATrainConfig,
    out_dir: str | Path,
    *,
    model_config: dict | None = None,
    pruning: PruningConfig | None = None,
    vocab_size: int = 1024,
    init_checkpoint: str | Path | None = None,
    progress: Callable[[VLAProgress], None] | None = None,
    stop_at: int | None = None,
) -> VLAResult:
    """Train the VLA on `frame` (columns of learner.data.SFT_COLUMNS) and write out_dir/vla_checkpoint.pt.

    Resumes from out_dir's checkpoint when there is one. Otherwise starts from `init_checkpoint` (its
    weights and tokenizer, fresh optimiser), else a fresh model from `model_config` with a tokenizer trained
    on the frame. Seeded: the same frame and config give the same weights, whether or not the run was
    interrupted. `stop_at`: checkpoint and return after this step (a run sliced across sessions).
    """
    torch.set_num_threads(config.num_threads)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    ckpt_path = out / CHECKPOINT_NAME
    rng = np.random.default_rng(config.seed)
    start_step, state = 0, None
    if ckpt_path.exists():
        state = torch.load(ckpt_path, map_location="cpu", weights_only=True)
        tok = ActionTokenizer.from_json(state["tokenizer"])
        pruning = PruningConfig(**state["pruning"])
        model = VLA(VLAConfig.from_dict(state["model_config"]))
        if config.lora_rank:
            apply_lora(model, config.lora_rank, config.lora_alpha)
        model.load_state_dict(state["model"])
        start_step = int(state["step"])
        rng.bit_generator.state = state["rng"]
    elif init_checkpoint is not None:
        model, tok, pruning = load_vla(init_checkpoint)
        if config.lora_rank:
            apply_lora(model, config.lora_rank, config.lora_alpha)
    else:
        torch.manual_seed(config.seed)
        tok = train_tokenizer(tokenizer_corpus(frame), vocab_size=vocab_size)
        pruning = pruning or PruningConfig()
        model = VLA(VLAConfig(**{**(model_config or {}), "vocab_size": tok.vocab_size, "bin_px": tok.bin_px}))
        if config.lora_rank:
            apply_lora(model, config.lora_rank, config.lora_alpha)
    data = VLADataset(frame, tok, model.cfg, pruning)
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=config.lr, weight_decay=config.weight_decay)
    if state is not None:
        optimizer.load_state_dict(state["optimizer"])

    losses: list[float] = []
    model.train()
    t0, cpu0 = time.perf_counter(), time.process_time()
    bar = tqdm(total=config.steps, initial=start_step, desc="vla sft", file=sys.stderr,
               disable=not (config.progress_bar and sys.stderr.isatty()))  # fmt: skip
    end = config.steps if stop_at is None else min(stop_at, config.steps)
    for step in range(start_step, end):
        lr = lr_at(step, config)
        for group in optimizer.param_groups:
            group["lr"] = lr
        keep = keep_count(model.cfg.num_patches, float(rng.choice(config.keep_ratios)))
        batch = data.batch(rng.integers(0, len(data), size=config.batch_size))
        logits, relevance, _ = model(batch["image"], batch["prior"], batch["instruction_ids"], batch["text_ids"], keep)
        total, token_nll, relevance_nll = vla_loss(
            logits, batch["labels"], relevance, batch["target_patch"], config.relevance_weight
        )
        optimizer.zero_grad(set_to_none=True)
        total.backward()
        if config.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(trainable, config.grad_clip)
        optimizer.step()
        losses.append(total.item())
        done = step + 1
        bar.update(1)
        bar.set_postfix(loss=f"{losses[-1]:.3f}", tok=f"{token_nll.item():.3f}", rel=f"{relevance_nll.item():.2f}")
        if config.checkpoint_every and done % config.checkpoint_every == 0:
            save_checkpoint(ckpt_path, model, tok, optimizer, done, config, pruning, rng.bit_generator.state)
        if progress is not None and (done % config.log_every == 0 or done == config.steps):
            rate = len(losses) * config.batch_size / max(time.perf_counter() - t0, 1e-9)
            progress(VLAProgress(done, config.steps, losses[-1], token_nll.item(), relevance_nll.item(), lr, rate))
    bar.close()
    wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    steps = max(end, start_step)
    save_checkpoint(ckpt_path, model, tok, optimizer, steps, config, pruning, rng.bit_generator.state)
    return VLAResult(
        checkpoint_path=ckpt_path,
        model=merge_lora(model).eval(),
        tokenizer=tok,
        pruning=pruning,
        start_step=start_step,
        steps=steps,
        losses=losses,
        samples_per_s=len(losses) * config.batch_size / max(wall, 1e-9),
        wall_s=wall,
        cpu_s=cpu,
        num_parameters=model.num_parameters(),
    )
