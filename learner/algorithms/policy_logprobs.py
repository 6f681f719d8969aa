"""log pi_theta of generated tokens under the action grammar: the learner's side of every importance ratio.

The edge draws each token from the grammar-masked distribution (policy.sampling); the learner must score
the same token under the same support, or pi_theta / mu compares two different distributions. At
temperature 1 without top-k, a freshly exported model gives mu == pi_theta: the ratio is 1 on-policy
(tested against the ONNX runtime).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch

from learner.model.vla import VLA
from learner.model.vla_loss import IGNORE
from policy.sampling import MAX_TEXT_TOKENS
from policy.tokens import ActionTokenizer


def grammar_masks(tok: ActionTokenizer, labels: torch.Tensor, max_thought_tokens: int) -> torch.Tensor:
    """(B, T, V) bool: the tokens the grammar allows at each labelled position of `labels` (B, T).

    A row's labels are its generated ids in order (IGNORE elsewhere); unlabelled positions allow every token
    so their log-softmax stays finite (they are masked out of every loss)."""
    b, t = labels.shape
    masks = np.ones((b, t, tok.vocab_size), dtype=bool)
    for row in range(b):
        positions = torch.nonzero(labels[row] != IGNORE)[:, 0].tolist()
        generated = labels[row, positions].tolist()
        for j, position in enumerate(positions):
            masks[row, position] = tok.allowed_next(generated[:j], max_thought_tokens, MAX_TEXT_TOKENS)
    return torch.from_numpy(masks)


def action_positions(labels: torch.Tensor, act_id: int) -> torch.Tensor:
    """(B, T) float: 1 at the labelled positions after each row's <act> (the action's tokens, <eos> included),
    0 at the thought's and at <act> itself. labels (B, T), IGNORE where unlabelled."""
    seen_act = (labels == act_id).long().cumsum(1) > 0  # (B, T) at or after <act>
    return (seen_act & (labels != act_id) & (labels != IGNORE)).float()


class Scored(NamedTuple):
    """A teacher-forced batch under the grammar."""

    logp: torch.Tensor  # (B, T) log pi of each label, 0 where unlabelled
    logp_all: torch.Tensor  # (B, T, V) -inf outside the grammar
    mask: torch.Tensor  # (B, T) float, 1 at labelled positions
    relevance: (
        torch.Tensor
    )  # (B, N) the pruning relevance of each patch (taught by learner.model.vla_loss.target_patch_nll)


def token_logprobs(model: VLA, batch: dict[str, torch.Tensor], masks: torch.Tensor, keep: int) -> Scored:
    """Teacher-forced log pi_theta of a batch (learner.data.dataset.VLADataset.batch) under the grammar."""
    logits, relevance, _ = model(batch["image"], batch["prior"], batch["instruction_ids"], batch["instruction_chars"],
                                 batch["text_ids"], keep)  # fmt: skip  # (B, T, V)
    logp_all = logits.masked_fill(~masks, float("-inf")).log_softmax(-1)  # (B, T, V)
    labels = batch["labels"]
    mask = (labels != IGNORE).float()  # (B, T)
    picked = logp_all.gather(-1, labels.clamp(min=0)[..., None])[..., 0]  # (B, T)
    logp = torch.where(mask > 0, picked, torch.zeros_like(picked))
    return Scored(logp, logp_all, mask, relevance)
