"""SFT of the VLA on demonstrations read from Delta: maximum likelihood of thought + action tokens.

Every batch: B steps sampled uniformly with replacement (B is the global batch: under torchrun each process
trains on its slice, learner.distributed), one keep ratio drawn from `keep_ratios`
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

import msgspec
import numpy as np
import polars as pl
import torch
from tqdm import tqdm

from learner import distributed
from learner.augment import random_view
from learner.config import VLATrainConfig
from learner.vla import IGNORE, VLA, VLAConfig, target_patch_index, vla_loss
from policy.pruning import PruningConfig, keep_count, patch_prior
from policy.screen import POSITIONAL_TYPES, decode_png
from policy.tokens import ActionTokenizer, char_ids, short_thought, train_tokenizer
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
    """Demonstration steps, decoded once: screenshots (M, 210, 160, 3) uint8, pruning priors, token sequences.

    `batch` with an augmenting config draws a fresh view (learner.augment) of every sampled step: its
    screenshot and previous frame are warped alike, the prior is recomputed from them and a click target's
    coordinate tokens and target patch follow the pixels."""

    def __init__(self, frame: pl.DataFrame, tok: ActionTokenizer, cfg: VLAConfig, pruning: PruningConfig):
        frame = frame.sort("episode_id", "step")
        self.tok, self.cfg, self.pruning = tok, cfg, pruning
        self.screens = np.stack([decode_png(png) for png in frame["screenshot"]])  # (M, 210, 160, 3)
        self.previous = _previous_index(frame["episode_id"].to_list(), frame["step"].to_list())  # (M,), -1: none
        self.priors = np.stack([patch_prior(self.screens[i], self._previous_screen(i), cfg.patch_px, pruning)
                                for i in range(len(self.screens))])  # fmt: skip  # (M, N)
        self.instruction: list[list[int]] = []
        self.chars: list[list[int]] = []
        self.thought: list[str] = []
        self.action: list[Action] = []
        self.prompt: list[list[int]] = []
        # A model's rollout is scored on the ids it generated (exact for importance ratios), a
        # demonstration on the tokenisation of its thought and action.
        self.generated: list[list[int]] = []
        for row in frame.iter_rows(named=True):
            action = Action(row["action_type"], x=row["x"] or 0.0, y=row["y"] or 0.0, text=row["text"] or "",
                            key=row["key"] or "")  # fmt: skip
            prompt = tok.prompt_ids(row["instruction"] or "", cfg.max_instruction_tokens)
            self.instruction.append(prompt[1:-1])
            self.chars.append(char_ids(row["instruction"] or "", cfg.max_instruction_chars))
            self.thought.append(row["thought"] or "")
            self.action.append(action)
            self.prompt.append(prompt)
            self.generated.append(list(row.get("tokens") or []))

    def __len__(self) -> int:
        return len(self.action)

    def _previous_screen(self, i: int) -> np.ndarray | None:
        return self.screens[self.previous[i]] if self.previous[i] >= 0 else None

    def _target(self, action: Action) -> tuple[float, float] | None:
        return (action.x, action.y) if action.type in POSITIONAL_TYPES else None

    def batch(self, idx: np.ndarray, rng: np.random.Generator | None = None,
              config: VLATrainConfig | None = None) -> dict[str, torch.Tensor]:  # fmt: skip
        """The steps `idx` as model inputs; seen through random views when `config` augments (rng draws them)."""
        augment = config is not None and bool(config.augment_shift_px or config.augment_scale or config.augment_colour)
        images, priors, actions = self.screens[idx], self.priors[idx], [self.action[i] for i in idx]
        if augment:
            images, priors = images.copy(), priors.copy()
            for row, i in enumerate(idx):
                target = self._target(actions[row])
                view = random_view(rng, config.augment_shift_px, config.augment_scale, config.augment_colour, target)
                images[row] = view.apply(self.screens[i])
                previous = self._previous_screen(i)
                previous = view.apply(previous) if previous is not None else None
                priors[row] = patch_prior(images[row], previous, self.cfg.patch_px, self.pruning)
                if target is not None:
                    x, y = view.point(*target)
                    actions[row] = msgspec.structs.replace(actions[row], x=x, y=y)
        if augment and any(self.generated[i] for i in idx):
            raise ValueError("recorded rollout tokens cannot be augmented: a view would move the clicked pixels")
        texts, prompt_lens, target_patch = [], [], np.full(len(idx), -1, dtype=np.int64)
        for row, (i, action) in enumerate(zip(idx, actions, strict=True)):
            target = self.generated[i] or self.tok.target_ids(self.thought[i], action, self.cfg.max_thought_tokens)
            texts.append(self.prompt[i] + target)
            prompt_lens.append(len(self.prompt[i]))
            if action.type in POSITIONAL_TYPES:
                target_patch[row] = target_patch_index(action.x, action.y, self.cfg.patch_px)
        width = max(len(t) for t in texts)
        text_ids = np.zeros((len(idx), width), dtype=np.int64)
        labels = np.full((len(idx), width), IGNORE, dtype=np.int64)
        for row, (text, start) in enumerate(zip(texts, prompt_lens, strict=True)):
            text_ids[row, : len(text)] = text
            labels[row, start : len(text)] = text[start:]
        return {
            "image": torch.from_numpy(np.ascontiguousarray(images.transpose(0, 3, 1, 2))),  # (B, 3, 210, 160)
            "prior": torch.from_numpy(priors),
            "instruction_ids": torch.from_numpy(_right_padded([self.instruction[i] for i in idx])),
            "instruction_chars": torch.from_numpy(_right_padded([self.chars[i] for i in idx])),
            "text_ids": torch.from_numpy(text_ids),
            "labels": torch.from_numpy(labels),
            "target_patch": torch.from_numpy(target_patch),
        }


def _right_padded(rows: list[list[int]]) -> np.ndarray:
    """(B, max len) int64, rows padded with 0 (every row at least one wide)."""
    out = np.zeros((len(rows), max(1, max(len(r) for r in rows))), dtype=np.int64)
    for i, r in enumerate(rows):
        out[i, : len(r)] = r
    return out


def _previous_index(episodes: list[str], steps: list[int]) -> np.ndarray:
    """(M,) index of the same episode's previous step, -1 for a first step (or one whose predecessor is absent)."""
    index = {(e, s): i for i, (e, s) in enumerate(zip(episodes, steps, strict=True))}
    return np.array([index.get((e, s - 1), -1) for e, s in zip(episodes, steps, strict=True)], dtype=np.int64)


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
        model, tok, pruning, state = resume_checkpoint(ckpt_path, config)
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
    net = distributed.wrap(model)  # the model itself outside torchrun
    t0, cpu0 = time.perf_counter(), time.process_time()
    bar = tqdm(total=config.steps, initial=start_step, desc="vla sft", file=sys.stderr,
               disable=not (config.progress_bar and sys.stderr.isatty()))  # fmt: skip
    end = config.steps if stop_at is None else min(stop_at, config.steps)
    for step in range(start_step, end):
        lr = lr_at(step, config)
        for group in optimizer.param_groups:
            group["lr"] = lr
        keep = keep_count(model.cfg.num_patches, float(rng.choice(config.keep_ratios)))
        # Under torchrun every process draws the same global batch and trains on its slice (learner.distributed).
        batch = distributed.local_slice(data.batch(rng.integers(0, len(data), size=config.batch_size), rng, config))
        logits, relevance, _ = net(batch["image"], batch["prior"], batch["instruction_ids"],
                                   batch["instruction_chars"], batch["text_ids"], keep)  # fmt: skip
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
        if config.checkpoint_every and done % config.checkpoint_every == 0 and distributed.is_main():
            save_checkpoint(ckpt_path, model, tok, optimizer, done, config, pruning, rng.bit_generator.state)
        if config.snapshot_every and done % config.snapshot_every == 0 and distributed.is_main():
            (out / "snapshots").mkdir(exist_ok=True)
            snapshot = out / "snapshots" / f"step-{done}.pt"
            save_checkpoint(snapshot, model, tok, optimizer, done, config, pruning, rng.bit_generator.state)
        if progress is not None and (done % config.log_every == 0 or done == config.steps):
            rate = len(losses) * config.batch_size / max(time.perf_counter() - t0, 1e-9)
            progress(VLAProgress(done, config.steps, losses[-1], token_nll.item(), relevance_nll.item(), lr, rate))
    bar.close()
    wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    steps = max(end, start_step)
    if distributed.is_main():
        save_checkpoint(ckpt_path, model, tok, optimizer, steps, config, pruning, rng.bit_generator.state)
    distributed.barrier()
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
