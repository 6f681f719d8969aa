"""The VLA's supervised losses, each written as its math: the token NLL and the pruning relevance's target-patch NLL
(`vla_loss`), or, for a click-map model, the token NLL without the coordinates and the map's multi-positive click NLL
(`click_map_loss`)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from policy.pruning import grid_shape
from policy.screen import SCREEN_H, SCREEN_W

IGNORE = -100  # label of positions that carry no loss (visual tokens, prompt, padding)


def vla_loss(
    logits: torch.Tensor,  # (B, T, V): logits[:, t] predicts text position t (VLA.forward)
    labels: torch.Tensor,  # (B, T) target token per text position, IGNORE elsewhere
    relevance: torch.Tensor,  # (B, N)
    target_patch: torch.Tensor,  # (B,) patch index of the click target, -1 when the action has none
    relevance_weight: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """L = token NLL + relevance_weight * target-patch NLL. Returns (total, token_nll, relevance_nll)."""
    token_nll = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), ignore_index=IGNORE)
    relevance_nll = target_patch_nll(relevance, target_patch)
    return token_nll + relevance_weight * relevance_nll, token_nll, relevance_nll


def click_map_loss(
    logits: torch.Tensor,  # (B, T, V) (VLA.forward)
    labels: torch.Tensor,  # (B, T) target token per text position, IGNORE elsewhere
    click_map: torch.Tensor,  # (B, Y, X) log-probabilities of a click in each bin (Encoded.click_map)
    positives: torch.Tensor,  # (B, Y, X) bool: the bins inside the click target's element (none: no click)
    coordinate_ids: tuple[int, int],  # [first, end) of the coordinate token ids (VLA.coordinate_ids)
    map_weight: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A click-map model's SFT loss: L = token NLL over the tokens the decoder writes + map_weight * click NLL.

    The coordinate tokens leave the token mean: the map scores them, and its loss credits any bin of the target's
    element (the expert's pixel is one of many right answers) once per click step, not as 2 tokens of ~15.
    Returns (total, token_nll, click_nll)."""
    first, end = coordinate_ids
    decoder_labels = labels.masked_fill((labels >= first) & (labels < end), IGNORE)
    token_nll = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), decoder_labels.reshape(-1), ignore_index=IGNORE)
    click_nll = click_map_nll(click_map, positives)
    return token_nll + map_weight * click_nll, token_nll, click_nll


def click_map_nll(click_map: torch.Tensor, positives: torch.Tensor) -> torch.Tensor:
    """Multi-positive NLL: mean over the rows with a target of -log sum_{bins in the target's box} P(bin).
    click_map (B, Y, X) log-probabilities, positives (B, Y, X) bool -> scalar (0, with a gradient, when none)."""
    has_target = positives.flatten(1).any(1)  # (B,)
    if not has_target.any():
        return click_map.sum() * 0.0
    return click_map_row_nll(click_map, positives)[has_target].mean()


def click_map_row_nll(click_map: torch.Tensor, positives: torch.Tensor) -> torch.Tensor:
    """(B,) each row's -log P(its target's box); +inf for a row without a target (click_map_nll leaves those out)."""
    return -click_map.masked_fill(~positives, float("-inf")).flatten(1).logsumexp(1)


def target_patch_nll(relevance: torch.Tensor, target_patch: torch.Tensor) -> torch.Tensor:
    """What teaches the pruning relevance: mean -log softmax(relevance)[target patch] over the rows that have a
    target (>= 0). relevance (B, N), target_patch (B,) -> scalar (0, with a gradient path, when none has)."""
    has_target = target_patch >= 0
    if not has_target.any():
        return relevance.sum() * 0.0
    return F.cross_entropy(relevance[has_target], target_patch[has_target])


def target_patch_index(x: float, y: float, patch_px: int) -> int:
    """Raster index of the patch holding pixel (x, y)."""
    _, cols = grid_shape(patch_px)
    col = min(max(int(x // patch_px), 0), SCREEN_W // patch_px - 1)
    row = min(max(int(y // patch_px), 0), SCREEN_H // patch_px - 1)
    return row * cols + col
