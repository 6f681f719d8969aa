"""The VLA: a patch encoder over the screenshot, visual-token pruning, and a transformers GPT-2 decoder
that writes a short thought and then action tokens (policy.tokens).

    image (B,3,210,160) uint8 ─ normalise ─ conv k=s=patch_px/2 ─ conv 3x3 ─ patchify conv (k = s = 2)
                                              ─> LayerNorm ─> patches (B, N, d) + s · (wte[<x_col>] + wte[<y_row>])
    instruction ids (B, L) ─ wte ─ masked mean ─ MLP ─> query q (B, r)
    relevance (B, N) = <W_k patches, q> / sqrt(r)                       (trained to point at the target patch)
    kept = top-k(relevance + prior)                                     (policy.pruning; k fixed per batch)
    decoder input = [patches[kept] | <bos> instruction <sep> | thought <act> type x y ... <eos>]
    GPT2LMHeadModel (tied embeddings) ─> next-token logits

Coordinate tokens are scored by pointing (`coordinate_logits`): the decoder state h_t queries the kept visual
tokens, s_ti = <W_q h_t, W_k v_i> / sqrt(r); the logit of <x_b> is logsumexp of s_ti over kept patches in the
column holding bin b, plus a fine in-patch term W_f h_t (a patch spans patch_px / bin_px bins); <y_b> likewise
by rows. These replace the LM head's logits for the coordinate ids, so the model still writes action tokens,
but learning to click is learning where to look. A patch's position embedding is the embedding of its
centre's coordinate tokens (the same vectors the decoder reads back when it sees <x_b> <y_b>).

Loss (per batch, written out in `vla_loss`):
    L = mean over target tokens of −log p(token | prefix)
      + λ_rel · mean over click/scroll steps of −log softmax(relevance)[target patch]
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn
from transformers import GPT2Config, GPT2LMHeadModel

from policy.pruning import grid_shape
from policy.screen import PIXEL_MEAN, PIXEL_STD, SCREEN_H, SCREEN_W
from policy.tokens import special_tokens

IGNORE = -100  # label of positions that carry no loss (visual tokens, prompt, padding)


@dataclass(frozen=True)
class VLAConfig:
    """Architecture. Everything a checkpoint needs to rebuild the model (the vocabulary comes from the tokenizer)."""

    vocab_size: int
    """Tokenizer vocabulary, action tokens included."""
    patch_px: int = 10
    """Side of a visual token's patch in pixels: 10 -> 21x16 = 336 tokens. Must be even and divide 210 and 160."""
    stem_channels: int = 48
    """Channels of the stem at 2x the patch grid's resolution (42x32 for 10 px patches)."""
    context_kernel: tuple[int, int] | None = None
    """(rows, cols) of a depthwise conv over the patch grid that mixes each visual token with its neighbours,
    so its features (and its pointer key) span a word, not 2-3 letters: (3, 7) sees +-30 px along a line.
    None: no mixing (the models before it)."""
    d_model: int = 160
    """Width of the decoder and of the visual tokens."""
    n_layers: int = 4
    n_heads: int = 4
    d_ff: int = 512
    max_positions: int = 512
    """Longest sequence: visual tokens + prompt + target."""
    relevance_dim: int = 32
    """Width r of the patch-instruction relevance dot product that ranks patches for pruning."""
    max_instruction_tokens: int = 48
    max_thought_tokens: int = 32
    bin_px: int = 5
    """Pixels per coordinate token (must match the tokenizer's)."""

    def to_dict(self) -> dict:
        # Options left off are left out, so models without them keep the config (and the bundle bytes) they had.
        return {k: v for k, v in asdict(self).items() if v is not None}

    @classmethod
    def from_dict(cls, data: dict) -> VLAConfig:
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})

    @property
    def num_patches(self) -> int:
        rows, cols = grid_shape(self.patch_px)
        return rows * cols


# log of a 0/1 membership matrix: 0 where patch i lies in column (row) c, -MEMBERSHIP elsewhere. Finite, so a
# column with no kept patch keeps a tiny logit and a target under a pruned patch still has a gradient.
MEMBERSHIP = 30.0


class Pointer(NamedTuple):
    keys: torch.Tensor  # (B, k, r) pointer keys of the kept visual tokens
    col_bias: torch.Tensor  # (B, k, C) 0 where kept patch i lies in column c, -MEMBERSHIP elsewhere
    row_bias: torch.Tensor  # (B, k, R) likewise for rows


class Encoded(NamedTuple):
    patches: torch.Tensor  # (B, N, d) visual tokens with their 2-D position embeddings
    relevance: torch.Tensor  # (B, N) relevance logits of each patch to the instruction


class PatchEncoder(nn.Module):
    """Pixels -> one d-vector per patch, position included; plus each patch's relevance to the instruction."""

    def __init__(self, cfg: VLAConfig, wte: nn.Embedding):
        super().__init__()
        c, d = cfg.stem_channels, cfg.d_model
        self.rows, self.cols = grid_shape(cfg.patch_px)
        half = cfg.patch_px // 2
        # Cheap on purpose (~45 MMAC per screen): the stem runs on every patch, pruned or not.
        self.stem = nn.Sequential(
            nn.Conv2d(3, c, half, stride=half),  # (B, c, 42, 32): one vector per half-patch
            nn.GELU(),
            nn.Conv2d(c, c, 3, padding=1),  # mixes neighbouring half-patches (glyph strokes cross borders)
            nn.GELU(),
        )
        self.patchify = nn.Conv2d(c, d, 2, stride=2)  # (B, d, 21, 16)
        self.context = None
        if cfg.context_kernel:
            kh, kw = cfg.context_kernel
            self.context = nn.Sequential(
                nn.Conv2d(d, d, (kh, kw), padding=(kh // 2, kw // 2), groups=d), nn.GELU(), nn.Conv2d(d, d, 1)
            )
        self.norm = nn.LayerNorm(d)
        # Coordinate tokens of each patch row / column centre (policy.tokens puts them at fixed ids).
        specials = special_tokens(cfg.bin_px)
        centre = cfg.patch_px // 2
        x_ids = [specials.index(f"<x_{(c * cfg.patch_px + centre) // cfg.bin_px}>") for c in range(self.cols)]
        y_ids = [specials.index(f"<y_{(r * cfg.patch_px + centre) // cfg.bin_px}>") for r in range(self.rows)]
        self.register_buffer("x_ids", torch.tensor(x_ids), persistent=False)
        self.register_buffer("y_ids", torch.tensor(y_ids), persistent=False)
        # Token embeddings start at std 0.02; scaled so position and content (LayerNorm, std 1) weigh alike.
        self.pos_scale = nn.Parameter(torch.tensor(50.0))
        # The relevance of a patch is also a feature of it: the decoder finds "the patch the instruction is
        # about" by one direction instead of re-learning the relevance match in its attention.
        self.relevance_embed = nn.Parameter(torch.randn(d) * 0.1)
        self.wte = wte  # shared with the decoder: the instruction query reads the same token embeddings
        self.query = nn.Sequential(nn.Linear(d, d), nn.GELU(), nn.Linear(d, cfg.relevance_dim))
        self.key = nn.Linear(d, cfg.relevance_dim)
        self.relevance_dim = cfg.relevance_dim

    def forward(self, image: torch.Tensor, instruction_ids: torch.Tensor) -> Encoded:
        x = (image.float() - PIXEL_MEAN) / PIXEL_STD  # (B, 3, 210, 160)
        x = self.patchify(self.stem(x))  # (B, d, R, C)
        if self.context is not None:
            x = x + self.context(x)  # residual: the token's own patch stays its main content
        x = x.flatten(2).transpose(1, 2)  # (B, N, d), raster order
        pos = (self.wte(self.y_ids)[:, None, :] + self.wte(self.x_ids)[None, :, :]).reshape(-1, x.shape[-1])  # (N, d)
        patches = self.norm(x) + self.pos_scale * pos
        mask = (instruction_ids != 0).float()[..., None]  # (B, L, 1); 0 is <pad>
        text = (self.wte(instruction_ids) * mask).sum(1) / mask.sum(1).clamp(min=1.0)  # (B, d)
        q = self.query(text)  # (B, r)
        relevance = torch.einsum("bnr,br->bn", self.key(patches), q) / math.sqrt(self.relevance_dim)  # (B, N)
        # Detached: the relevance is taught by its own loss; the decoder only reads it.
        patches = patches + relevance.detach()[..., None] * self.relevance_embed
        return Encoded(patches, relevance)


class VLA(nn.Module):
    def __init__(self, cfg: VLAConfig):
        super().__init__()
        self.cfg = cfg
        gpt = GPT2Config(
            vocab_size=cfg.vocab_size,
            n_positions=cfg.max_positions,
            n_embd=cfg.d_model,
            n_layer=cfg.n_layers,
            n_head=cfg.n_heads,
            n_inner=cfg.d_ff,
            activation_function="gelu",  # one fused op; gelu_new is four elementwise passes on CPU
            resid_pdrop=0.0,
            embd_pdrop=0.0,
            attn_pdrop=0.0,
            tie_word_embeddings=True,
            bos_token_id=1,
            eos_token_id=4,
            pad_token_id=0,
        )
        self.decoder = GPT2LMHeadModel(gpt)
        self.encoder = PatchEncoder(cfg, self.decoder.transformer.wte)
        specials = special_tokens(cfg.bin_px)
        self.x0, self.y0 = specials.index("<x_0>"), specials.index("<y_0>")
        self.rows, self.cols = grid_shape(cfg.patch_px)
        self.bins_per_patch = cfg.patch_px // cfg.bin_px
        if cfg.patch_px % cfg.bin_px or self.y0 != self.x0 + self.cols * self.bins_per_patch:
            raise ValueError(f"patch_px={cfg.patch_px} must be a multiple of bin_px={cfg.bin_px}")
        self.pointer_q = nn.Linear(cfg.d_model, cfg.relevance_dim)
        self.pointer_k = nn.Linear(cfg.d_model, cfg.relevance_dim)
        self.fine = nn.Linear(cfg.d_model, 2 * self.bins_per_patch)

    @property
    def wte(self) -> nn.Embedding:
        return self.decoder.transformer.wte

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def encode(self, image: torch.Tensor, instruction_ids: torch.Tensor) -> Encoded:
        return self.encoder(image, instruction_ids)

    def keep_indices(self, relevance: torch.Tensor, prior: torch.Tensor, keep: int) -> torch.Tensor:
        """(B, keep) indices of the kept patches in raster order (policy.pruning.select_patches in torch)."""
        top = torch.topk(relevance.detach() + prior, keep, dim=1).indices
        return top.sort(dim=1).values

    def sequence_embeds(self, patches: torch.Tensor, kept: torch.Tensor, text_ids: torch.Tensor) -> torch.Tensor:
        """[kept patches | token embeddings of text_ids] -> (B, keep + T, d)."""
        vis = patches.gather(1, kept[..., None].expand(-1, -1, patches.shape[-1]))  # (B, keep, d)
        return torch.cat([vis, self.wte(text_ids)], dim=1)

    def forward(
        self,
        image: torch.Tensor,  # (B, 3, 210, 160) uint8
        prior: torch.Tensor,  # (B, N) float, from policy.pruning.patch_prior
        instruction_ids: torch.Tensor,  # (B, L) instruction BPE ids, right-padded with 0 (the relevance query)
        text_ids: torch.Tensor,  # (B, T) prompt + target, right-padded with 0
        keep: int,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Teacher-forced pass. Returns (logits (B, T, V), relevance (B, N), kept (B, keep)).

        logits[:, t] is the prediction of text_ids[:, t] (from the position before it); the LM head runs
        on text positions only (the visual positions predict nothing)."""
        encoded = self.encode(image, instruction_ids)
        kept = self.keep_indices(encoded.relevance, prior, keep)
        embeds = self.sequence_embeds(encoded.patches, kept, text_ids)
        attention = torch.cat([torch.ones_like(kept), (text_ids != 0).long()], dim=1)
        hidden = self.decoder.transformer(inputs_embeds=embeds, attention_mask=attention).last_hidden_state
        pointer = self.pointer_targets(embeds[:, :keep], kept)
        logits = self.output_logits(hidden[:, keep - 1 : -1], pointer)  # (B, T, V)
        return logits, encoded.relevance, kept

    def pointer_targets(self, vis: torch.Tensor, kept: torch.Tensor) -> Pointer:
        """What the coordinate tokens point at, computed once per step (not once per decoded token)."""
        in_col = ((kept % self.cols)[..., None] == torch.arange(self.cols)).float()  # (B, k, C)
        in_row = ((kept // self.cols)[..., None] == torch.arange(self.rows)).float()  # (B, k, R)
        return Pointer(self.pointer_k(vis), (in_col - 1.0) * MEMBERSHIP, (in_row - 1.0) * MEMBERSHIP)

    def output_logits(self, hidden: torch.Tensor, pointer: Pointer) -> torch.Tensor:
        """(B, T, d) final hidden states -> (B, T, V): the LM head, with coordinate ids scored by pointing."""
        lm = self.decoder.lm_head(hidden)  # (B, T, V)
        x_logits, y_logits = self.coordinate_logits(hidden, pointer)
        end = self.y0 + y_logits.shape[-1]
        return torch.cat([lm[..., : self.x0], x_logits, y_logits, lm[..., end:]], dim=-1)

    def coordinate_logits(self, hidden: torch.Tensor, pointer: Pointer) -> tuple[torch.Tensor, torch.Tensor]:
        """Pointer logits of the x and y tokens: (B, T, cols * bpp) and (B, T, rows * bpp), bpp = bins per patch."""
        keys, col_bias, row_bias = pointer
        s = torch.einsum("btr,bkr->btk", self.pointer_q(hidden), keys) / math.sqrt(keys.shape[-1])  # (B, T, k)
        col = torch.logsumexp(s[..., None] + col_bias[:, None], dim=2)  # (B, T, C)
        row = torch.logsumexp(s[..., None] + row_bias[:, None], dim=2)  # (B, T, R)
        fine = self.fine(hidden)  # (B, T, 2 * bpp)
        fx, fy = fine[..., : self.bins_per_patch], fine[..., self.bins_per_patch :]
        x_logits = (col[..., None] + fx[..., None, :]).flatten(-2)  # (B, T, C * bpp)
        y_logits = (row[..., None] + fy[..., None, :]).flatten(-2)  # (B, T, R * bpp)
        return x_logits, y_logits


def vla_loss(
    logits: torch.Tensor,  # (B, T, V): logits[:, t] predicts text position t (VLA.forward)
    labels: torch.Tensor,  # (B, T) target token per text position, IGNORE elsewhere
    relevance: torch.Tensor,  # (B, N)
    target_patch: torch.Tensor,  # (B,) patch index of the click target, -1 when the action has none
    relevance_weight: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """L = token NLL + relevance_weight * target-patch NLL. Returns (total, token_nll, relevance_nll)."""
    token_nll = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), ignore_index=IGNORE)
    has_target = target_patch >= 0
    if has_target.any():
        relevance_nll = F.cross_entropy(relevance[has_target], target_patch[has_target])
    else:
        relevance_nll = relevance.sum() * 0.0
    return token_nll + relevance_weight * relevance_nll, token_nll, relevance_nll


def target_patch_index(x: float, y: float, patch_px: int) -> int:
    """Raster index of the patch holding pixel (x, y)."""
    _, cols = grid_shape(patch_px)
    col = min(max(int(x // patch_px), 0), SCREEN_W // patch_px - 1)
    row = min(max(int(y // patch_px), 0), SCREEN_H // patch_px - 1)
    return row * cols + col
