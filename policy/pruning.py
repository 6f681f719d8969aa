"""Visual-token pruning, in the spirit of Mano-P's GSPruning: which screen patches reach the decoder.

The screen (210x160) is cut into patches of `patch_px` pixels (10 -> a 21x16 grid, N = 336 tokens).
Every patch gets a score; the decoder sees the top `keep = round(keep_ratio * N)` patches, in raster
order (each carries its own 2-D position embedding, so dropping tokens does not shift the others).

    score = relevance            learned: <patch, instruction> from the model's encoder
          + ANCHOR   if anchor   a fixed stride grid of patches is always kept (spatial anchors)
          - FLAT     if flat     a patch whose pixels barely vary carries nothing (blank background)
          - unchanged_penalty    if the patch equals the previous frame's (nothing new happened there)
          + PROTECT  if among the MAP_TOP_CELLS most relevant, for a click-map model (its click target)

FLAT is large but finite: flat patches fill the budget only when the screen has too little else, so
`keep` is the same for every screen (fixed shapes in training and at the edge). This module is
numpy-only: training (learner.model.vla) and the edge runtime compute the same prior from the same pixels.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from policy.screen import SCREEN_H, SCREEN_W

ANCHOR = 1e4
FLAT = 1e3
PROTECT = 1e5
MAP_TOP_CELLS = 4
"""A click-map model's decoder always sees the map's top cells, whatever the prior says of them (a solid colour
box is flat, yet it may be the target): pruning thins the decoder's context, never what the map points at."""


@dataclass(frozen=True)
class PruningConfig:
    keep_ratio: float = 0.25
    """Fraction of the N patch tokens the decoder sees (1.0: no pruning)."""
    flat_std: float = 3.0
    """A patch whose pixel standard deviation (0-255 scale, over its pixels and channels) is below this is flat."""
    unchanged_mad: float = 1.0
    """A patch whose mean absolute difference to the previous frame is below this is unchanged."""
    unchanged_penalty: float = 2.0
    """Score subtracted from unchanged patches (logit units of the relevance)."""
    anchor_stride: int = 4
    """Every anchor_stride-th patch row and column (offset stride // 2) is an anchor; 0 disables anchors."""

    def __post_init__(self) -> None:
        if not 0.0 < self.keep_ratio <= 1.0:
            raise ValueError(f"keep_ratio must be in (0, 1], got {self.keep_ratio}")


def grid_shape(patch_px: int) -> tuple[int, int]:
    if SCREEN_H % patch_px or SCREEN_W % patch_px:
        raise ValueError(f"patch_px={patch_px} must divide {SCREEN_H} and {SCREEN_W}")
    return SCREEN_H // patch_px, SCREEN_W // patch_px


def keep_count(num_patches: int, keep_ratio: float) -> int:
    return max(1, min(num_patches, round(keep_ratio * num_patches)))


def _patches(image: np.ndarray, patch_px: int) -> np.ndarray:
    """(210, 160, 3) uint8 -> (N, patch_px * patch_px * 3) float32, raster order."""
    rows, cols = grid_shape(patch_px)
    x = image[:, :, :3].astype(np.float32).reshape(rows, patch_px, cols, patch_px, 3)
    return x.transpose(0, 2, 1, 3, 4).reshape(rows * cols, -1)


def anchor_mask(patch_px: int, stride: int) -> np.ndarray:
    """(N,) bool: the anchor grid."""
    rows, cols = grid_shape(patch_px)
    mask = np.zeros((rows, cols), dtype=bool)
    if stride > 0:
        mask[stride // 2 :: stride, stride // 2 :: stride] = True
    return mask.reshape(-1)


def patch_prior(image: np.ndarray, previous: np.ndarray | None, patch_px: int, config: PruningConfig) -> np.ndarray:
    """(N,) float32 score prior of each patch of `image` (HWC uint8), given the previous frame or None."""
    patches = _patches(image, patch_px)
    prior = np.zeros(len(patches), dtype=np.float32)
    prior[patches.std(axis=1) < config.flat_std] -= FLAT
    if previous is not None:
        mad = np.abs(patches - _patches(previous, patch_px)).mean(axis=1)
        prior[mad < config.unchanged_mad] -= config.unchanged_penalty
    prior[anchor_mask(patch_px, config.anchor_stride)] += ANCHOR
    return prior


def select_patches(relevance: np.ndarray, prior: np.ndarray, keep: int, protect: int = 0) -> np.ndarray:
    """Indices (keep,) int64 of the kept patches in raster order: top-`keep` of relevance + prior, the `protect`
    most relevant first (MAP_TOP_CELLS for a click-map model)."""
    score = relevance.astype(np.float32) + prior
    if protect:
        score[np.argpartition(-relevance, protect - 1)[:protect]] += PROTECT
    top = np.argpartition(-score, keep - 1)[:keep] if keep < len(score) else np.arange(len(score))
    return np.sort(top).astype(np.int64)
