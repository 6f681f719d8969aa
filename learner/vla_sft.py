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
    diagnostics: dict = field(default_factory=dict)
    """What the stage reports of its update (learner.stages): KLs, clip fraction, entropy, ..."""


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
        # The prompt's history: the actions of the episode's earlier steps (those taken, as the edge
        # remembers them), unless a row carries the exact prompt it was sampled from (semi-online rollouts,
        # whose history holds the expert's action where a step was patched).
        histories: list[list[Action]] = []
        explicit = frame["prompt"].to_list() if "prompt" in frame.columns else [None] * frame.height
        for i, row in enumerate(frame.iter_rows(named=True)):
            action = Action(row["action_type"], x=row["x"] or 0.0, y=row["y"] or 0.0, text=row["text"] or "",
                            key=row["key"] or "")  # fmt: skip
            before = self.previous[i]
            histories.append([*histories[before], self.action[before]] if before >= 0 else [])
            prompt = explicit[i] or tok.prompt_ids(row["instruction"] or "", cfg.max_instruction_tokens,
                                                   histories[i], cfg.history_actions)  # fmt: skip
            self.instruction.append(tok.instruction_ids(row["instruction"] or "", cfg.max_instruction_tokens))
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
                            self.pruning, self.rng.bit_generator.state)  # fmt: skip

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
    return TrainingRun(out, config, model, tok, pruning, rng, optimizer, step)


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

    def fresh() -> tuple[VLA, ActionTokenizer, PruningConfig]:
        if init_checkpoint is not None:
            model, tok, start_pruning = load_vla(init_checkpoint)
        else:
            torch.manual_seed(config.seed)
            tok = train_tokenizer(tokenizer_corpus(frame), vocab_size=vocab_size)
            start_pruning = pruning or PruningConfig()
            model = VLA(VLAConfig(**{**(model_config or {}), "vocab_size": tok.vocab_size, "bin_px": tok.bin_px}))
        if config.lora_rank:
            apply_lora(model, config.lora_rank, config.lora_alpha)
        return model, tok, start_pruning

    run = open_run(out_dir, config, fresh)
    model, tok, rng, optimizer = run.model, run.tok, run.rng, run.optimizer
    data = VLADataset(frame, tok, model.cfg, run.pruning)

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
