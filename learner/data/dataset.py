"""The steps a stage trains on (demonstrations or rollouts), decoded once, and their batches as model inputs.

`VLADataset` decodes a frame's screenshots, pruning priors and token sequences (prompt, thought + action, or
a rollout's generated ids); `batch` turns sampled rows into the model's tensors, through random views
(learner.data.augment) when asked. `tokenizer_corpus` is what a fresh model's BPE is trained on.
"""

from __future__ import annotations

import msgspec
import numpy as np
import polars as pl
import torch

from learner.data.augment import random_view
from learner.model.vla_config import VLAConfig
from learner.model.vla_loss import IGNORE, target_patch_index
from learner.recipe import Augmentation
from policy.pruning import PruningConfig, patch_prior
from policy.screen import POSITIONAL_TYPES, SCREEN_H, SCREEN_W, decode_png
from policy.tokens import ActionTokenizer, char_ids, short_thought
from schemas import Action

BALANCES = ("rows", "tasks", "episodes")
MAP_BALANCES = ("tasks", "loss")


class VLADataset:
    """Demonstration steps, decoded once: screenshots (M, 210, 160, 3) uint8, pruning priors, token sequences.

    `batch` with an active Augmentation draws a fresh view (learner.data.augment) of every sampled step: its
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
        # A teacher-labelled row's target is the teacher's action, but the history the next steps' prompts hold is
        # the action the policy took there (taken_*, learner.data.teacher_labels); a row without one took its target.
        explicit = frame["prompt"].to_list() if "prompt" in frame.columns else [None] * frame.height
        taken: list[Action] = []
        for i, row in enumerate(frame.iter_rows(named=True)):
            action = Action(row["action_type"], x=row["x"] or 0.0, y=row["y"] or 0.0, text=row["text"] or "",
                            key=row["key"] or "")  # fmt: skip
            taken.append(Action(row["taken_action_type"], x=row["taken_x"] or 0.0, y=row["taken_y"] or 0.0,
                                text=row["taken_text"] or "", key=row["taken_key"] or "")
                         if row.get("taken_action_type") else action)  # fmt: skip
            before = self.previous[i]
            histories.append([*histories[before], taken[before]] if before >= 0 else [])
            prompt = explicit[i] or tok.prompt_ids(row["instruction"] or "", cfg.max_instruction_tokens,
                                                   histories[i], cfg.history_actions)  # fmt: skip
            self.instruction.append(tok.instruction_ids(row["instruction"] or "", cfg.max_instruction_tokens))
            self.chars.append(char_ids(row["instruction"] or "", cfg.max_instruction_chars))
            self.thought.append(row["thought"] or "")
            self.action.append(action)
            self.prompt.append(prompt)
            self.generated.append(list(row.get("tokens") or []))
        # The element a click aims at (left, top, right, bottom), where the expert recorded it: every bin of it is a
        # right answer for a click-map model (learner.model.vla_loss.click_map_nll); without it, the clicked bin alone.
        boxes = frame["target_box"].to_list() if "target_box" in frame.columns else [None] * frame.height
        self.boxes = [tuple(b) if b is not None and len(b) == 4 else None for b in boxes]
        # The rows a batch may train on: all but the context rows before a teacher's label (`train` false).
        train = frame["train"].fill_null(True).to_numpy() if "train" in frame.columns else np.ones(frame.height, bool)
        self.trainable = np.flatnonzero(train)
        self.positional = np.array([a.type in POSITIONAL_TYPES for a in self.action], dtype=bool)
        self.tasks = frame["task"].to_numpy() if "task" in frame.columns else np.full(frame.height, "")
        self.by_task = _rows_by_task(self.tasks, self.trainable)
        self.clicks_by_task = _rows_by_task(self.tasks, self.trainable[self.positional[self.trainable]])
        self.click_task_of = np.full(frame.height, -1, dtype=np.int64)  # row -> its index in clicks_by_task
        for group, rows in enumerate(self.clicks_by_task):
            self.click_task_of[rows] = group
        # (tasks,) each task's mean trainable steps per episode, normalised: the "episodes" balance's task weights.
        episodes = frame["episode_id"].to_numpy()
        lengths = np.array([len(rows) / len(set(episodes[rows])) for rows in self.by_task])
        self.episode_length_by_task = lengths / lengths.sum() if len(lengths) else lengths

    def __len__(self) -> int:
        return len(self.action)

    def sample(self, rng: np.random.Generator, size: int, balance: str = "rows",
               clicks_only: bool = False, task_weights: np.ndarray | None = None) -> np.ndarray:  # fmt: skip
        """(size,) trainable rows drawn with replacement, as `balance` says (learner.recipe.VLATrainConfig):
        "rows" uniformly (the same draws as before context rows existed when every row is trainable: a seeded
        run's weights do not change), "tasks" a task uniformly, then one of its rows, "episodes" a task with
        probability proportional to its mean episode length, then one of its rows. `clicks_only`: rows whose
        action has a screen target (click, scroll), a task drawn uniformly or with `task_weights` (one probability
        per click task, TaskLossWeights)."""
        if balance not in BALANCES:
            raise ValueError(f"balance must be one of {BALANCES}, got {balance!r}")
        if clicks_only or balance != "rows":
            groups = self.clicks_by_task if clicks_only else self.by_task
            if not groups:
                raise ValueError("no trainable click steps to sample" if clicks_only else "no trainable rows to sample")
            if clicks_only and task_weights is not None:
                picks = rng.choice(len(groups), size=size, p=task_weights)
            elif clicks_only or balance == "tasks":
                picks = rng.integers(0, len(groups), size=size)
            else:
                picks = rng.choice(len(groups), size=size, p=self.episode_length_by_task)
            return np.array([groups[g][rng.integers(0, len(groups[g]))] for g in picks], dtype=np.int64)
        if len(self.trainable) == len(self):
            return rng.integers(0, len(self), size=size)
        return self.trainable[rng.integers(0, len(self.trainable), size=size)]

    def rows_per_task(self) -> dict[str, dict[str, int]]:
        """What the sampler draws from, per task: trainable rows, click rows and the distinct screens of those."""
        out = {}
        for task in sorted(set(self.tasks[self.trainable])):
            rows = self.trainable[self.tasks[self.trainable] == task]
            clicks = rows[self.positional[rows]]
            out[str(task)] = {"rows": len(rows), "click_rows": len(clicks),
                              "click_screens": len({hash(self.screens[i].tobytes()) for i in clicks})}  # fmt: skip
        return out

    def _previous_screen(self, i: int) -> np.ndarray | None:
        return self.screens[self.previous[i]] if self.previous[i] >= 0 else None

    def _target(self, action: Action) -> tuple[float, float] | None:
        return (action.x, action.y) if action.type in POSITIONAL_TYPES else None

    def batch(self, idx: np.ndarray, rng: np.random.Generator | None = None,
              augmentation: Augmentation | None = None) -> dict[str, torch.Tensor]:  # fmt: skip
        """The steps `idx` as model inputs; seen through random views when `augmentation` is active (rng draws
        them)."""
        augment = augmentation is not None and augmentation.active
        images, priors, actions = self.screens[idx], self.priors[idx], [self.action[i] for i in idx]
        boxes = [self.boxes[i] for i in idx]
        if augment:
            images, priors = images.copy(), priors.copy()
            for row, i in enumerate(idx):
                target = self._target(actions[row])
                view = random_view(rng, augmentation.shift_px, augmentation.scale, augmentation.colour, target)
                images[row] = view.apply(self.screens[i])
                previous = self._previous_screen(i)
                previous = view.apply(previous) if previous is not None else None
                priors[row] = patch_prior(images[row], previous, self.cfg.patch_px, self.pruning)
                if target is not None:
                    x, y = view.point(*target)
                    actions[row] = msgspec.structs.replace(actions[row], x=x, y=y)
                if boxes[row] is not None:
                    left, top, right, bottom = boxes[row]
                    boxes[row] = (*view.point(left, top), *view.point(right, bottom))
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
        extra = {}
        if self.cfg.click_map:
            extra["positives"] = torch.from_numpy(np.stack([
                click_positives(self._target(a), box if a.type in POSITIONAL_TYPES else None, self.tok.bin_px)
                for a, box in zip(actions, boxes, strict=True)]))  # fmt: skip  # (B, Y, X) bool
        return extra | {
            "image": torch.from_numpy(np.ascontiguousarray(images.transpose(0, 3, 1, 2))),  # (B, 3, 210, 160)
            "prior": torch.from_numpy(priors),
            "instruction_ids": torch.from_numpy(_right_padded([self.instruction[i] for i in idx])),
            "instruction_chars": torch.from_numpy(_right_padded([self.chars[i] for i in idx])),
            "text_ids": torch.from_numpy(text_ids),
            "labels": torch.from_numpy(labels),
            "target_patch": torch.from_numpy(target_patch),
        }


def click_positives(point: tuple[float, float] | None, box: tuple[float, ...] | None, bin_px: int) -> np.ndarray:
    """(Y, X) bool over the screen's bins: those whose centre lies in the target's element box, and always the
    bin of the clicked point itself (a box too small to hold a bin centre still has its click). All False when
    the action has no screen target."""
    ny, nx = -(-SCREEN_H // bin_px), -(-SCREEN_W // bin_px)
    positives = np.zeros((ny, nx), dtype=bool)
    if point is None:
        return positives
    if box is not None:
        left, top, right, bottom = box
        centres_x, centres_y = (np.arange(nx) + 0.5) * bin_px, (np.arange(ny) + 0.5) * bin_px
        inside_x = (centres_x >= left) & (centres_x <= right)
        inside_y = (centres_y >= top) & (centres_y <= bottom)
        positives |= inside_y[:, None] & inside_x[None, :]
    x, y = point
    positives[min(max(int(y // bin_px), 0), ny - 1), min(max(int(x // bin_px), 0), nx - 1)] = True
    return positives


class TaskLossWeights:
    """map_balance "loss": the probability of drawing each click task for a map-only batch, half uniform and half
    proportional to the task's running map NLL (an exponential moving average over the batches that drew it). The
    uniform half keeps every task visited, so a solved task that starts to slip is seen again."""

    def __init__(self, tasks: int, decay: float = 0.9, nll: list[float] | None = None):
        self.decay = decay
        self.nll = np.array(nll, dtype=np.float64) if nll else np.ones(tasks)  # (tasks,)
        if len(self.nll) != tasks:
            raise ValueError(f"the checkpoint's map loss has {len(self.nll)} click tasks, the data {tasks}")

    def probabilities(self) -> np.ndarray:
        """(tasks,) sums to 1."""
        return 0.5 * self.nll / self.nll.sum() + 0.5 / len(self.nll)

    def update(self, groups: np.ndarray, row_nll: np.ndarray) -> None:
        """A batch's click tasks (B,) and each row's map NLL (B,); rows without a target (NaN) are left out."""
        for group in np.unique(groups[~np.isnan(row_nll)]):
            seen = row_nll[(groups == group) & ~np.isnan(row_nll)].mean()
            self.nll[group] = self.decay * self.nll[group] + (1.0 - self.decay) * seen


def _rows_by_task(tasks: np.ndarray, rows: np.ndarray) -> list[np.ndarray]:
    """`rows` grouped by their task, one array per task (tasks sorted)."""
    return [rows[tasks[rows] == task] for task in sorted(set(tasks[rows]))]


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
