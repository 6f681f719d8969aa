"""Pre- and post-processing shared by the learner (torch) and the edge runtime (onnxruntime).

This module must stay torch-free: edge installs have numpy, pillow and onnxruntime only.
Training and inference both go through `prepare_inputs` / `encode_target` / `decode_greedy`, so what the
model sees at the edge is byte-for-byte what it saw in training.

Conventions
-----------
* Image: the (210, 160, 3) uint8 RGB task area becomes a (3, 210, 160) uint8 array. Pixel normalisation,
  (pixel - PIXEL_MEAN) / PIXEL_STD, happens inside the model graph (so the ONNX input stays uint8).
* Instruction: UTF-8 bytes, id = byte + 1 (0 is padding), truncated / right-padded to `max_len`.
* Click grid: cells of `cell_px` pixels, row-major index `row * grid_w + col`; a click at pixel (x, y) is
  cell (y // cell_px, x // cell_px) with in-cell offset ((x mod cell_px) / cell_px, (y mod cell_px) / cell_px).
"""

from __future__ import annotations

import io
import typing
from dataclasses import dataclass

import numpy as np

from schemas.events import ActionType

SCREEN_H = 210
SCREEN_W = 160
PIXEL_MEAN = 127.5  # applied inside the model: (pixel - PIXEL_MEAN) / PIXEL_STD
PIXEL_STD = 64.0
PAD_ID = 0
BYTE_VOCAB = 257  # 256 byte values shifted by one, plus padding
DEFAULT_MAX_BYTES = 96

ACTION_TYPES: tuple[str, ...] = ("click", "type", "key", "scroll", "noop")
POSITIONAL_TYPES: frozenset[str] = frozenset({"click", "scroll"})  # action types whose (x, y) is a target
assert set(ACTION_TYPES) == set(typing.get_args(ActionType)), "ACTION_TYPES drifted from schemas.ActionType"


def decode_png(png: bytes) -> np.ndarray:
    """PNG bytes -> (H, W, 3) uint8 RGB."""
    from PIL import Image  # pillow is an edge dependency; imported lazily to keep import cheap

    with Image.open(io.BytesIO(png)) as img:
        return np.asarray(img.convert("RGB"), dtype=np.uint8)


def screenshot_to_chw(screenshot: np.ndarray) -> np.ndarray:
    """(210, 160, 3|4) uint8 HWC -> (3, 210, 160) uint8 CHW (alpha dropped). Raises on any other size."""
    arr = np.asarray(screenshot)
    if arr.ndim != 3 or arr.shape[:2] != (SCREEN_H, SCREEN_W) or arr.shape[2] not in (3, 4):
        raise ValueError(f"screenshot must be ({SCREEN_H}, {SCREEN_W}, 3) uint8, got {arr.shape} {arr.dtype}")
    if arr.dtype != np.uint8:
        raise ValueError(f"screenshot must be uint8, got {arr.dtype}")
    return np.ascontiguousarray(arr[:, :, :3].transpose(2, 0, 1))


def encode_instruction(text: str, max_len: int = DEFAULT_MAX_BYTES) -> np.ndarray:
    """Instruction -> (max_len,) int64 byte ids (byte + 1, 0 = padding), whitespace-stripped and truncated."""
    raw = text.strip().encode("utf-8")[:max_len]
    ids = np.zeros(max_len, dtype=np.int64)
    ids[: len(raw)] = np.frombuffer(raw, dtype=np.uint8).astype(np.int64) + 1
    return ids


def prepare_inputs(screenshot: np.ndarray, instruction: str, max_len: int = DEFAULT_MAX_BYTES) -> dict[str, np.ndarray]:
    """One observation -> the model's named inputs, batch of one.

    Returns {"image": (1, 3, 210, 160) uint8, "instruction_ids": (1, max_len) int64}.
    """
    return {
        "image": screenshot_to_chw(screenshot)[None],
        "instruction_ids": encode_instruction(instruction, max_len)[None],
    }


@dataclass(frozen=True)
class Grid:
    """The click grid over the task area."""

    cell_px: int
    """Side of one square cell in pixels; must divide both 210 and 160."""

    @property
    def rows(self) -> int:
        return SCREEN_H // self.cell_px

    @property
    def cols(self) -> int:
        return SCREEN_W // self.cell_px

    @property
    def cells(self) -> int:
        return self.rows * self.cols


@dataclass(frozen=True)
class Target:
    """A supervised action, encoded for the loss."""

    type_index: int  # index into ACTION_TYPES
    positional: bool  # whether (x, y) is a target (click / scroll)
    cell: int  # row-major cell index (0 when not positional)
    offset: tuple[float, float]  # in-cell (dx, dy) in [0, 1)


def encode_target(action_type: str, x: float, y: float, grid: Grid) -> Target:
    """(action type, x, y in pixels) -> Target; x, y are clamped into the task area."""
    if action_type not in ACTION_TYPES:
        raise ValueError(f"unknown action type {action_type!r}; expected one of {ACTION_TYPES}")
    positional = action_type in POSITIONAL_TYPES
    if not positional:
        return Target(ACTION_TYPES.index(action_type), False, 0, (0.5, 0.5))
    xc = min(max(float(x), 0.0), SCREEN_W - 1e-3)
    yc = min(max(float(y), 0.0), SCREEN_H - 1e-3)
    col, row = int(xc // grid.cell_px), int(yc // grid.cell_px)
    offset = ((xc - col * grid.cell_px) / grid.cell_px, (yc - row * grid.cell_px) / grid.cell_px)
    return Target(ACTION_TYPES.index(action_type), True, row * grid.cols + col, offset)


def log_softmax(logits: np.ndarray) -> np.ndarray:
    """Numerically stable log-softmax over the last axis (float64)."""
    z = logits.astype(np.float64) - np.max(logits, axis=-1, keepdims=True)
    return z - np.log(np.sum(np.exp(z), axis=-1, keepdims=True))


@dataclass(frozen=True)
class GreedyAction:
    """The argmax action of one model output and its behaviour log-probability."""

    action_type: str
    row: int
    col: int
    x: float
    y: float
    logprob: float  # log p(type) + log p(cell) if the type is positional, else log p(type)
    type_logprob: float
    cell_logprob: float


def decode_greedy(
    type_logits: np.ndarray,  # (T,) over ACTION_TYPES
    cell_logits: np.ndarray,  # (G,) row-major over the grid
    cell_offsets: np.ndarray | None,  # (G, 2) in-cell (dx, dy) in [0, 1], or None for cell centres
    grid: Grid,
) -> GreedyAction:
    """Greedy decode: argmax type, argmax cell, pixel = (cell corner + offset * cell_px)."""
    type_lp = log_softmax(np.asarray(type_logits).reshape(-1))
    cell_lp = log_softmax(np.asarray(cell_logits).reshape(-1))
    t = int(np.argmax(type_lp))
    c = int(np.argmax(cell_lp))
    row, col = divmod(c, grid.cols)
    dx, dy = (0.5, 0.5) if cell_offsets is None else (float(v) for v in np.asarray(cell_offsets).reshape(-1, 2)[c])
    x = (col + dx) * grid.cell_px
    y = (row + dy) * grid.cell_px
    action_type = ACTION_TYPES[t]
    positional = action_type in POSITIONAL_TYPES
    logprob = float(type_lp[t] + (cell_lp[c] if positional else 0.0))
    return GreedyAction(action_type, row, col, float(x), float(y), logprob, float(type_lp[t]), float(cell_lp[c]))


def encode_png(screenshot: np.ndarray) -> bytes:
    """(H, W, 3) uint8 RGB -> PNG bytes (the inverse of decode_png)."""
    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(np.asarray(screenshot, dtype=np.uint8)).save(buffer, format="PNG", compress_level=1)
    return buffer.getvalue()
