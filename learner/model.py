"""A small pixel policy: screenshot + instruction bytes -> action type logits and a click heatmap.

    image (B,3,210,160) uint8 ──normalise──> stem conv s2 ──> patch conv (one vector per cell) + pos-emb
                                                                   │ (B,C,gh,gw)
    instruction bytes (B,L) ──embed──> 1-D convs ──> masked mean|max pool ──> text (B,Dt)
                                                                   │ FiLM (γ, β) per residual block
                                                      residual conv blocks at cell resolution
                                                        ├─ 1x1 conv + <q(text), k(cell)> ──> cell logits (B, gh*gw)
                                                        ├─ 1x1 conv ──> in-cell offsets (B, gh*gw, 2) ∈ [0,1]
                                                        └─ mean|max pool ⊕ text ──> MLP ──> type logits (B, 5)

The behaviour log-probability of an action is log p(type) + log p(cell) for positional types (click, scroll)
and log p(type) otherwise; the in-cell offset is a deterministic regression and carries no probability mass.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from edge_client.onnx_policy import make_decision
from edge_client.policy import Decision, Observation
from edge_client.preprocess import (
    ACTION_TYPES,
    BYTE_VOCAB,
    DEFAULT_MAX_BYTES,
    PAD_ID,
    PIXEL_MEAN,
    PIXEL_STD,
    POSITIONAL_TYPES,
    SCREEN_H,
    SCREEN_W,
    GreedyAction,
    Grid,
    decode_greedy,
    prepare_inputs,
)


@dataclass(frozen=True)
class PolicyConfig:
    """Architecture of the small pixel policy. Everything the checkpoint needs to rebuild the model."""

    cell_px: int = 10
    """Side of a click-grid cell in pixels. Must be even and divide 210 and 160 (10 -> 21x16 = 336 cells)."""

    stem_channels: int = 24
    """Channels of the first conv (3x3, stride 2) at half resolution (105x80 for the default size)."""

    channels: int = 64
    """Channels C of the per-cell feature map after the patch conv (kernel = stride = cell_px / 2)."""

    num_blocks: int = 3
    """Residual FiLM blocks (two 3x3 convs each) at cell resolution; each widens the receptive field 4 cells."""

    groups: int = 8
    """GroupNorm groups in the residual blocks; must divide `channels`."""

    max_instruction_bytes: int = DEFAULT_MAX_BYTES
    """Instruction length L in UTF-8 bytes (truncated / zero-padded)."""

    byte_embed_dim: int = 48
    """Embedding width of one instruction byte."""

    text_channels: int = 96
    """Width Dt of the 1-D conv instruction encoder and of the pooled instruction vector."""

    text_layers: int = 2
    """Number of 1-D conv layers (kernel 3) over the byte embeddings."""

    type_hidden: int = 96
    """Hidden width of the action-type MLP."""

    query_dim: int = 32
    """Width of the text-query / cell-key dot product added to the cell logits (0 disables)."""

    predict_offset: bool = True
    """Regress an in-cell (dx, dy) offset per cell; False clicks at cell centres."""

    def __post_init__(self) -> None:
        if self.cell_px % 2 or SCREEN_H % self.cell_px or SCREEN_W % self.cell_px:
            raise ValueError(f"cell_px={self.cell_px} must be even and divide {SCREEN_H} and {SCREEN_W}")
        if self.channels % self.groups:
            raise ValueError(f"groups={self.groups} must divide channels={self.channels}")

    @property
    def grid(self) -> Grid:
        return Grid(self.cell_px)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> PolicyConfig:
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})


class PolicyOutput(NamedTuple):
    type_logits: torch.Tensor  # (B, T) over ACTION_TYPES
    cell_logits: torch.Tensor  # (B, G) row-major over the grid, G = gh * gw
    cell_offsets: torch.Tensor  # (B, G, 2) in-cell (dx, dy) in [0, 1]


class InstructionEncoder(nn.Module):
    """Byte ids (B, L) -> instruction vector (B, Dt): embed, 1-D convs, masked mean and max pooling."""

    def __init__(self, cfg: PolicyConfig):
        super().__init__()
        self.embed = nn.Embedding(BYTE_VOCAB, cfg.byte_embed_dim, padding_idx=PAD_ID)
        dims = [cfg.byte_embed_dim] + [cfg.text_channels] * cfg.text_layers
        self.convs = nn.ModuleList(nn.Conv1d(a, b, 3, padding=1) for a, b in zip(dims[:-1], dims[1:], strict=True))
        self.proj = nn.Linear(2 * dims[-1], cfg.text_channels)
        self.norm = nn.LayerNorm(cfg.text_channels)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        mask = (ids != PAD_ID).unsqueeze(1).float()  # (B, 1, L)
        h = self.embed(ids).transpose(1, 2)  # (B, E, L)
        for conv in self.convs:
            h = F.relu(conv(h)) * mask  # (B, Dt, L), padding positions zeroed
        mean = h.sum(-1) / mask.sum(-1).clamp(min=1.0)  # (B, Dt)
        peak = h.amax(-1)  # (B, Dt); relu >= 0 and pads are 0, so pads never win
        return self.norm(self.proj(torch.cat([mean, peak], -1)))  # (B, Dt)


class FiLMBlock(nn.Module):
    """x + conv(relu(γ ⊙ GN(conv(x)) + β)), with (γ, β) = Linear(text); γ centred at 1."""

    def __init__(self, channels: int, text_dim: int, groups: int):
        super().__init__()
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1)
        self.norm = nn.GroupNorm(groups, channels)
        self.film = nn.Linear(text_dim, 2 * channels)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1)
        nn.init.zeros_(self.film.weight)
        nn.init.zeros_(self.film.bias)

    def forward(self, x: torch.Tensor, text: torch.Tensor) -> torch.Tensor:
        gamma, beta = self.film(text)[:, :, None, None].chunk(2, dim=1)  # (B, C, 1, 1) each
        h = self.norm(self.conv1(x)) * (1.0 + gamma) + beta  # (B, C, gh, gw)
        return x + self.conv2(F.relu(h))


class PixelPolicy(nn.Module):
    """The small pixel policy; `forward(image uint8 (B,3,210,160), ids (B,L))` -> PolicyOutput."""

    def __init__(self, cfg: PolicyConfig | None = None):
        super().__init__()
        self.cfg = cfg = cfg or PolicyConfig()
        grid = cfg.grid
        patch = cfg.cell_px // 2
        self.stem = nn.Conv2d(3, cfg.stem_channels, 3, stride=2, padding=1)  # (B, S, 105, 80)
        self.patch = nn.Conv2d(cfg.stem_channels, cfg.channels, patch, stride=patch)  # (B, C, gh, gw)
        self.pos = nn.Parameter(torch.randn(1, cfg.channels, grid.rows, grid.cols) * 0.02)
        self.text = InstructionEncoder(cfg)
        self.blocks = nn.ModuleList(
            FiLMBlock(cfg.channels, cfg.text_channels, cfg.groups) for _ in range(cfg.num_blocks)
        )
        self.out_norm = nn.GroupNorm(cfg.groups, cfg.channels)
        self.cell_head = nn.Conv2d(cfg.channels, 1, 1)
        self.offset_head = nn.Conv2d(cfg.channels, 2, 1)
        if cfg.query_dim:
            self.cell_key = nn.Conv2d(cfg.channels, cfg.query_dim, 1)
            self.cell_query = nn.Linear(cfg.text_channels, cfg.query_dim)
        self.type_head = nn.Sequential(
            nn.Linear(2 * cfg.channels + cfg.text_channels, cfg.type_hidden),
            nn.ReLU(),
            nn.Linear(cfg.type_hidden, len(ACTION_TYPES)),
        )

    def forward(self, image: torch.Tensor, instruction_ids: torch.Tensor) -> PolicyOutput:
        x = (image.float() - PIXEL_MEAN) / PIXEL_STD  # (B, 3, 210, 160)
        x = F.relu(self.stem(x))  # (B, S, 105, 80)
        x = self.patch(x) + self.pos  # (B, C, gh, gw)
        text = self.text(instruction_ids)  # (B, Dt)
        for block in self.blocks:
            x = block(x, text)
        x = F.relu(self.out_norm(x))  # (B, C, gh, gw)
        cell_logits = self.cell_head(x).flatten(1)  # (B, G)
        if self.cfg.query_dim:
            key = self.cell_key(x).flatten(2)  # (B, Dq, G)
            query = self.cell_query(text).unsqueeze(1)  # (B, 1, Dq)
            cell_logits = cell_logits + (query @ key).squeeze(1) / self.cfg.query_dim**0.5  # (B, G)
        if self.cfg.predict_offset:
            offsets = torch.sigmoid(self.offset_head(x)).flatten(2).transpose(1, 2)  # (B, G, 2)
        else:
            offsets = torch.full_like(cell_logits, 0.5).unsqueeze(-1).expand(-1, -1, 2)
        pooled = torch.cat([x.mean((2, 3)), x.amax((2, 3)), text], -1)  # (B, 2C + Dt)
        return PolicyOutput(self.type_head(pooled), cell_logits, offsets)

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())


def action_logprob(out: PolicyOutput, action_type: torch.Tensor, cell: torch.Tensor) -> torch.Tensor:
    """log π(a|s) = log p(type) + 1[type positional] · log p(cell); shapes (B,) in, (B,) out."""
    type_lp = out.type_logits.log_softmax(-1).gather(1, action_type[:, None]).squeeze(1)  # (B,)
    cell_lp = out.cell_logits.log_softmax(-1).gather(1, cell[:, None]).squeeze(1)  # (B,)
    positional = torch.tensor([t in POSITIONAL_TYPES for t in ACTION_TYPES], device=action_type.device)
    return type_lp + positional[action_type].float() * cell_lp


def greedy(model: PixelPolicy, screenshot, instruction: str) -> GreedyAction:
    """Greedy action of the torch model for one (210, 160, 3) uint8 screenshot, decoded as the edge does."""
    inputs = prepare_inputs(screenshot, instruction, model.cfg.max_instruction_bytes)
    with torch.inference_mode():
        out = model(torch.from_numpy(inputs["image"]), torch.from_numpy(inputs["instruction_ids"]))
    type_logits, cell_logits, offsets = (t[0].numpy() for t in out)
    return decode_greedy(type_logits, cell_logits, offsets, model.cfg.grid)


class TorchPolicy:
    """The torch model behind the edge Policy protocol (for evaluation in the learner; edge uses OnnxPolicy)."""

    def __init__(self, model: PixelPolicy, version: str):
        self.model = model.eval()
        self.version = version

    def act(self, obs: Observation) -> Decision:
        t0 = time.perf_counter()
        g = greedy(self.model, obs.screenshot, obs.instruction)
        return make_decision(g, (time.perf_counter() - t0) * 1e3)


def load_model(checkpoint: str | Path) -> PixelPolicy:
    """Rebuild a PixelPolicy from a checkpoint written by learner.sft ({"model_config": dict, "model": state})."""
    state = torch.load(checkpoint, map_location="cpu", weights_only=True)
    model = PixelPolicy(PolicyConfig.from_dict(state["model_config"]))
    model.load_state_dict(state["model"])
    return model.eval()
