"""The VLA: a patch encoder over the screenshot, visual-token pruning, and a transformers GPT-2 decoder
that writes a short thought and then action tokens (policy.tokens).

    image (B,3,210,160) uint8 ─ normalise ─ conv k=s=patch_px/2 ─ conv 3x3 ─ patchify conv (k = s = 2)
                                              ─> LayerNorm ─> patches (B, N, d) + s · (wte[<x_col>] + wte[<y_row>])
    instruction ids (B, L) ─ wte ─ masked mean ─ MLP ─> query q (B, r)
    relevance (B, N) = <W_k patches, q> / sqrt(r)                       (trained to point at the target patch)
    kept = top-k(relevance + prior)                                     (policy.pruning; k fixed per batch)
    decoder input = [patches[kept] | <bos> instruction history <sep> | thought <act> type x y ... <eos>]
    GPT2LMHeadModel (tied embeddings) ─> next-token logits

Coordinate tokens are scored by pointing (`coordinate_logits`): the decoder state h_t queries the kept visual
tokens, s_ti = <W_q h_t, W_k v_i> / sqrt(r); the logit of <x_b> is logsumexp of s_ti over kept patches in the
column holding bin b, plus a fine in-patch term W_f h_t (a patch spans patch_px / bin_px bins); <y_b> likewise
by rows. These replace the LM head's logits for the coordinate ids, so the model still writes action tokens,
but learning to click is learning where to look. A patch's position embedding is the embedding of its
centre's coordinate tokens (the same vectors the decoder reads back when it sees <x_b> <y_b>).

Two encoders (VLAConfig.encoder):

* "patch" (the first release): a 5x5 stride-5 conv over raw pixels, patchified to 10 px tokens; the
  instruction reaches the pixels only through a mean-pooled relevance query and the decoder's attention.
* "reading": the instruction shapes the visual features while they are formed, at a resolution that
  resolves glyphs (letters are ~6 px wide):

    chars (B, Lc) ─ embedding ─ two residual 1-D convs (13 chars seen) ─▶ char states (B, Lc, c)
        ─ P learned attention-pooling queries ─▶ text vector (B, P·c) ─ per-layer Linear ─▶ FiLM γ, β
    image ─ conv 3x3 s2 (2 px, 105x80) ─ FiLM ─ conv 5x5 s5 (10 px, 21x16) ─ 4 residual 3x3 blocks, each
        FiLM-conditioned ─ cross-attention of every cell over the char states ─▶ cells (B, N, C)
    relevance (B, N) = MLP(cells): the conditioned features already know what the instruction names
    patches = LayerNorm(Linear(cells)) + position, as above

Loss (per batch, written out in learner.model.vla_loss):
    L = mean over target tokens of −log p(token | prefix)
      + λ_rel · mean over click/scroll steps of −log softmax(relevance)[target patch]
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn
from transformers import GPT2Config, GPT2LMHeadModel

from learner.model.vla_config import VLAConfig
from policy.pruning import MAP_TOP_CELLS, PROTECT, grid_shape
from policy.screen import PIXEL_MEAN, PIXEL_STD
from policy.tokens import CHAR_VOCAB, special_tokens

# log of a 0/1 membership matrix: 0 where patch i lies in column (row) c, -MEMBERSHIP elsewhere. Finite, so a
# column with no kept patch keeps a tiny logit and a target under a pruned patch still has a gradient.
MEMBERSHIP = 30.0


class Pointer(NamedTuple):
    keys: torch.Tensor  # (B, k, r) pointer keys of the kept visual tokens
    col_bias: torch.Tensor  # (B, k, C) 0 where kept patch i lies in column c, -MEMBERSHIP elsewhere
    row_bias: torch.Tensor  # (B, k, R) likewise for rows
    score_bias: torch.Tensor  # (B, k) added to every pointer score: scale * relevance, or 0 (pointer_relevance)


class MapScores(NamedTuple):
    x: torch.Tensor  # (B, T, X) log P(x) of each x token at each position
    y: torch.Tensor  # (B, T, Y) log P(y | the x token the position reads)


class Encoded(NamedTuple):
    patches: torch.Tensor  # (B, N, d) visual tokens with their 2-D position embeddings
    relevance: torch.Tensor  # (B, N) relevance logits of each patch to the instruction
    click_map: torch.Tensor | None = None  # (B, 2R, 2C) log-probabilities of a click in each 5 px bin (click_map)


SUB = 2  # the click map's sub-cells per cell side: 10 px cells, 5 px bins


def click_map_layout(sub_logits: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    """(B, N, SUB*SUB) per-cell sub-cell logits (cells in raster order) -> (B, SUB*rows, SUB*cols) bin grid."""
    b = sub_logits.shape[0]
    grid = sub_logits.reshape(b, rows, cols, SUB, SUB).permute(0, 1, 3, 2, 4)  # (B, R, SUB, C, SUB)
    return grid.reshape(b, rows * SUB, cols * SUB)


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
        x_ids, y_ids = coordinate_ids(cfg)
        self.register_buffer("x_ids", x_ids, persistent=False)
        self.register_buffer("y_ids", y_ids, persistent=False)
        # Token embeddings start at std 0.02; scaled so position and content (LayerNorm, std 1) weigh alike.
        self.pos_scale = nn.Parameter(torch.tensor(50.0))
        # The relevance of a patch is also a feature of it: the decoder finds "the patch the instruction is
        # about" by one direction instead of re-learning the relevance match in its attention.
        self.relevance_embed = nn.Parameter(torch.randn(d) * 0.1)
        self.wte = wte  # shared with the decoder: the instruction query reads the same token embeddings
        self.query = nn.Sequential(nn.Linear(d, d), nn.GELU(), nn.Linear(d, cfg.relevance_dim))
        self.key = nn.Linear(d, cfg.relevance_dim)
        self.relevance_dim = cfg.relevance_dim

    def forward(self, image: torch.Tensor, instruction_ids: torch.Tensor, instruction_chars: torch.Tensor) -> Encoded:
        x = (image.float() - PIXEL_MEAN) / PIXEL_STD  # (B, 3, 210, 160)
        x = self.patchify(self.stem(x))  # (B, d, R, C)
        if self.context is not None:
            x = x + self.context(x)  # residual: the token's own patch stays its main content
        x = x.flatten(2).transpose(1, 2)  # (B, N, d), raster order
        patches = self.norm(x) + self.pos_scale * patch_positions(self.wte, self.x_ids, self.y_ids)
        mask = (instruction_ids != 0).float()[..., None]  # (B, L, 1); 0 is <pad>
        text = (self.wte(instruction_ids) * mask).sum(1) / mask.sum(1).clamp(min=1.0)  # (B, d)
        q = self.query(text)  # (B, r)
        relevance = torch.einsum("bnr,br->bn", self.key(patches), q) / math.sqrt(self.relevance_dim)  # (B, N)
        # Detached: the relevance is taught by its own loss; the decoder only reads it.
        patches = patches + relevance.detach()[..., None] * self.relevance_embed
        return Encoded(patches, relevance)


def coordinate_ids(cfg: VLAConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """Ids of the coordinate tokens of each patch column / row centre (policy.tokens puts them at fixed ids)."""
    specials = special_tokens(cfg.bin_px)
    rows, cols = grid_shape(cfg.patch_px)
    centre = cfg.patch_px // 2
    x_ids = [specials.index(f"<x_{(c * cfg.patch_px + centre) // cfg.bin_px}>") for c in range(cols)]
    y_ids = [specials.index(f"<y_{(r * cfg.patch_px + centre) // cfg.bin_px}>") for r in range(rows)]
    return torch.tensor(x_ids), torch.tensor(y_ids)


def patch_positions(wte: nn.Embedding, x_ids: torch.Tensor, y_ids: torch.Tensor) -> torch.Tensor:
    """(N, d) position embedding of each patch: the embeddings of its centre's <x_i> and <y_j> summed."""
    return (wte(y_ids)[:, None, :] + wte(x_ids)[None, :, :]).reshape(len(y_ids) * len(x_ids), -1)


class CharEncoder(nn.Module):
    """Instruction characters -> per-character states and P attention-pooled summaries of them.

    Two residual 1-D convs (kernel 5, the second dilated by 2) see 13 characters: a quoted word with its
    quotes, so a pooling query can learn to attend to "what is named" rather than to the template words."""

    def __init__(self, width: int, pools: int = 4):
        super().__init__()
        self.embed = nn.Embedding(CHAR_VOCAB, width, padding_idx=0)
        self.convs = nn.ModuleList([nn.Conv1d(width, width, 5, padding=2), nn.Conv1d(width, width, 5, padding=4,
                                                                                    dilation=2)])  # fmt: skip
        self.pool_queries = nn.Parameter(torch.randn(pools, width) / math.sqrt(width))

    def forward(self, chars: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """chars (B, L) -> states (B, L, c), text vector (B, P * c), additive pad bias (B, 1, L)."""
        keep = (chars != 0).float()  # (B, L)
        h = self.embed(chars)  # (B, L, c)
        for conv in self.convs:
            h = h + F.gelu(conv(h.transpose(1, 2))).transpose(1, 2) * keep[..., None]
        pad_bias = (keep[:, None, :] - 1.0) * 1e9  # 0 on characters, -1e9 on padding
        scores = torch.einsum("pc,blc->bpl", self.pool_queries, h) / math.sqrt(h.shape[-1]) + pad_bias  # (B, P, L)
        pooled = scores.softmax(-1) @ h  # (B, P, c)
        return h, pooled.flatten(1), pad_bias


class FiLM(nn.Module):
    """x * (1 + γ) + β, γ and β (per channel) a linear map of the instruction's text vector; starts as identity."""

    def __init__(self, text_dim: int, channels: int):
        super().__init__()
        self.proj = nn.Linear(text_dim, 2 * channels)
        nn.init.zeros_(self.proj.weight)
        nn.init.zeros_(self.proj.bias)

    def forward(self, x: torch.Tensor, text: torch.Tensor) -> torch.Tensor:
        gamma, beta = self.proj(text)[..., None, None].chunk(2, dim=1)  # (B, C, 1, 1) each
        return x * (1.0 + gamma) + beta


class CellAttention(nn.Module):
    """One pre-norm transformer layer over the encoder's cells: multi-head self-attention, then an MLP (4x)."""

    def __init__(self, channels: int, heads: int = 4):
        super().__init__()
        self.heads = heads
        self.norm_attn, self.norm_mlp = nn.LayerNorm(channels), nn.LayerNorm(channels)
        self.qkv, self.proj = nn.Linear(channels, 3 * channels), nn.Linear(channels, channels)
        self.mlp = nn.Sequential(nn.Linear(channels, 4 * channels), nn.GELU(), nn.Linear(4 * channels, channels))

    def forward(self, cells: torch.Tensor) -> torch.Tensor:
        b, n, c = cells.shape  # (B, N, C)
        q, k, v = self.qkv(self.norm_attn(cells)).reshape(b, n, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
        weights = (q @ k.transpose(-1, -2) / math.sqrt(c // self.heads)).softmax(-1)  # (B, H, N, N)
        cells = cells + self.proj((weights @ v).transpose(1, 2).reshape(b, n, c))
        return cells + self.mlp(self.norm_mlp(cells))


class ReadingEncoder(nn.Module):
    """Pixels + instruction characters -> instruction-conditioned 10 px visual tokens and their relevance.

    With reading_condition off, FiLM and the cross-attention are left out (the ablation's blind stem)."""

    def __init__(self, cfg: VLAConfig, wte: nn.Embedding):
        super().__init__()
        c, d = cfg.reading_channels, cfg.d_model
        half = c // 2
        if cfg.patch_px != 10:
            raise ValueError(f"the reading encoder makes 10 px tokens (2 px stem x 5), got patch_px={cfg.patch_px}")
        self.condition = cfg.reading_condition
        self.chars = CharEncoder(c) if self.condition else None
        text_dim = 4 * c
        self.conv_2px = nn.Conv2d(3, half, 3, stride=2, padding=1)  # (B, C/2, 105, 80): strokes of 6 px letters
        self.film_2px = FiLM(text_dim, half) if self.condition else None
        self.conv_10px = nn.Conv2d(half, c, 5, stride=5)  # (B, C, 21, 16): one vector per 10 px token
        self.blocks = nn.ModuleList(
            nn.ModuleList([nn.Conv2d(c, c, 3, padding=1), nn.Conv2d(c, c, 3, padding=1)])
            for _ in range(cfg.reading_blocks)
        )
        self.films = nn.ModuleList(FiLM(text_dim, c) for _ in range(cfg.reading_blocks)) if self.condition else None
        if self.condition:  # every cell asks the characters what it might be showing
            self.cross_q, self.cross_k = nn.Linear(c, c), nn.Linear(c, c)
            self.cross_v, self.cross_out = nn.Linear(c, c), nn.Linear(c, c)
        self.rows, self.cols = grid_shape(cfg.patch_px)
        self.global_layers = nn.ModuleList(CellAttention(c) for _ in range(cfg.reading_global_layers))
        if cfg.reading_global_layers:  # where each cell is: attention alone does not know
            self.cell_position = nn.Parameter(torch.randn(self.rows * self.cols, c) * 0.02)
        # click_map: SUB x SUB logits per cell (the map), whose logsumexp is the cell's relevance; else one logit.
        self.click_map = cfg.click_map
        self.relevance_head = nn.Sequential(nn.Linear(c, c), nn.GELU(), nn.Linear(c, SUB * SUB if cfg.click_map else 1))
        self.out = nn.Linear(c, d)
        self.norm = nn.LayerNorm(d)
        x_ids, y_ids = coordinate_ids(cfg)
        self.register_buffer("x_ids", x_ids, persistent=False)
        self.register_buffer("y_ids", y_ids, persistent=False)
        self.pos_scale = nn.Parameter(torch.tensor(50.0))  # as in PatchEncoder
        self.relevance_embed = nn.Parameter(torch.randn(d) * 0.1)
        self.wte = wte
        # oneDNN's convolutions run 1.6x faster (forward + backward, 64 channels) on channels-last tensors.
        self.to(memory_format=torch.channels_last)

    def forward(self, image: torch.Tensor, instruction_ids: torch.Tensor, instruction_chars: torch.Tensor) -> Encoded:
        x = ((image.float() - PIXEL_MEAN) / PIXEL_STD).contiguous(memory_format=torch.channels_last)  # (B, 3, 210, 160)
        if self.condition:
            states, text, pad_bias = self.chars(instruction_chars)  # (B, L, C), (B, 4C), (B, 1, L)
        x = F.gelu(self.conv_2px(x))  # (B, C/2, 105, 80)
        if self.condition:
            x = self.film_2px(x, text)
        x = F.gelu(self.conv_10px(x))  # (B, C, 21, 16)
        for j, (conv_a, conv_b) in enumerate(self.blocks):
            h = conv_a(x)
            if self.condition:
                h = self.films[j](h, text)
            x = x + conv_b(F.gelu(h))
        cells = x.flatten(2).transpose(1, 2)  # (B, N, C), raster order
        if self.condition:
            # (B, N, L): every cell's affinity to every character
            scores = self.cross_q(cells) @ self.cross_k(states).transpose(1, 2) / math.sqrt(cells.shape[-1])
            cells = cells + self.cross_out((scores + pad_bias).softmax(-1) @ self.cross_v(states))
        if self.global_layers:
            cells = cells + self.cell_position  # (B, N, C)
            for layer in self.global_layers:
                cells = layer(cells)
        heads = self.relevance_head(cells)  # (B, N, SUB*SUB) or (B, N, 1)
        click_map = None
        if self.click_map:
            # One joint softmax over every bin of the screen: the click competes with the whole task area.
            flat = click_map_layout(heads, self.rows, self.cols).flatten(1).log_softmax(-1)  # (B, 4N)
            click_map = flat.reshape(-1, self.rows * SUB, self.cols * SUB)  # (B, 2R, 2C)
            relevance = heads.logsumexp(-1)  # (B, N): a cell's share of the map (up to a constant)
        else:
            relevance = heads[..., 0]  # (B, N)
        patches = self.norm(self.out(cells)) + self.pos_scale * patch_positions(self.wte, self.x_ids, self.y_ids)
        # Detached: the relevance is taught by its own loss; the decoder only reads it.
        patches = patches + relevance.detach()[..., None] * self.relevance_embed
        return Encoded(patches, relevance, click_map)


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
        encoders = {"patch": PatchEncoder, "reading": ReadingEncoder}
        if cfg.encoder not in encoders:
            raise ValueError(f"encoder must be one of {sorted(encoders)}, got {cfg.encoder!r}")
        self.encoder = encoders[cfg.encoder](cfg, self.decoder.transformer.wte)
        specials = special_tokens(cfg.bin_px)
        self.x0, self.y0 = specials.index("<x_0>"), specials.index("<y_0>")
        self.rows, self.cols = grid_shape(cfg.patch_px)
        self.bins_per_patch = cfg.patch_px // cfg.bin_px
        if cfg.patch_px % cfg.bin_px or self.y0 != self.x0 + self.cols * self.bins_per_patch:
            raise ValueError(f"patch_px={cfg.patch_px} must be a multiple of bin_px={cfg.bin_px}")
        self.nx, self.ny = self.cols * self.bins_per_patch, self.rows * self.bins_per_patch
        if cfg.click_map:
            if cfg.encoder != "reading" or self.bins_per_patch != SUB or cfg.pointer_relevance:
                raise ValueError("click_map needs the reading encoder, patch_px = 2 * bin_px and no pointer_relevance")
            return  # the map scores the coordinates: no pointer
        self.pointer_q = nn.Linear(cfg.d_model, cfg.relevance_dim)
        self.pointer_k = nn.Linear(cfg.d_model, cfg.relevance_dim)
        self.fine = nn.Linear(cfg.d_model, 2 * self.bins_per_patch)
        if cfg.pointer_relevance:
            self.pointer_scale = nn.Parameter(torch.tensor(1.0))

    @property
    def wte(self) -> nn.Embedding:
        return self.decoder.transformer.wte

    @property
    def coordinate_ids(self) -> tuple[int, int]:
        """[first, end) of the coordinate token ids: the x tokens, then the y tokens."""
        return self.x0, self.y0 + self.ny

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def encode(self, image: torch.Tensor, instruction_ids: torch.Tensor, instruction_chars: torch.Tensor) -> Encoded:
        return self.encoder(image, instruction_ids, instruction_chars)

    def keep_indices(self, relevance: torch.Tensor, prior: torch.Tensor, keep: int) -> torch.Tensor:
        """(B, keep) indices of the kept patches in raster order (policy.pruning.select_patches in torch)."""
        score = relevance.detach() + prior
        if self.cfg.click_map:
            protected = torch.topk(relevance.detach(), MAP_TOP_CELLS, dim=1).indices  # (B, MAP_TOP_CELLS)
            score = score.scatter_add(1, protected, torch.full(protected.shape, PROTECT, dtype=score.dtype))
        top = torch.topk(score, keep, dim=1).indices
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
        instruction_chars: torch.Tensor,  # (B, Lc) policy.tokens.char_ids of the instruction, right-padded with 0
        text_ids: torch.Tensor | None,  # (B, T) prompt + target, right-padded with 0; None: the encoder alone
        keep: int,
    ) -> tuple[torch.Tensor | None, torch.Tensor, torch.Tensor | None]:
        """Teacher-forced pass. Returns (logits (B, T, V), relevance (B, N), click map (B, Y, X) or None).

        logits[:, t] is the prediction of text_ids[:, t] (from the position before it); the LM head runs
        on text positions only (the visual positions predict nothing). text_ids None: no decoder pass, logits
        None (a click map trained on steps with nothing for the decoder to write)."""
        encoded = self.encode(image, instruction_ids, instruction_chars)
        if text_ids is None:
            return None, encoded.relevance, encoded.click_map
        kept = self.keep_indices(encoded.relevance, prior, keep)
        embeds = self.sequence_embeds(encoded.patches, kept, text_ids)
        attention = torch.cat([torch.ones_like(kept), (text_ids != 0).long()], dim=1)
        hidden = self.decoder.transformer(inputs_embeds=embeds, attention_mask=attention).last_hidden_state
        if self.cfg.click_map:
            # logits[:, t] is read at the position of text_ids[:, t - 1] (the last visual token for t = 0)
            read = torch.cat([torch.full_like(text_ids[:, :1], -1), text_ids[:, :-1]], dim=1)  # (B, T)
            coordinates = self.map_scores(encoded.click_map, read)
        else:
            coordinates = self.pointer_targets(embeds[:, :keep], kept, encoded.relevance.gather(1, kept))
        logits = self.output_logits(hidden[:, keep - 1 : -1], coordinates)  # (B, T, V)
        return logits, encoded.relevance, encoded.click_map

    def map_scores(self, click_map: torch.Tensor, read_ids: torch.Tensor) -> MapScores:
        """The coordinate tokens' log-probabilities from the click map (B, Y, X), at positions reading read_ids
        (B, T): x gets the map's column marginal; y the chosen column's conditional where the position reads an
        x token (the only place the grammar allows y), the row marginal elsewhere."""
        x_marginal = click_map.logsumexp(1)  # (B, X) log P(x)
        column = (read_ids - self.x0).clamp(0, self.nx - 1)  # (B, T)
        is_x = (read_ids >= self.x0) & (read_ids < self.x0 + self.nx)  # (B, T)
        picked = click_map.gather(2, column[:, None, :].expand(-1, self.ny, -1)).transpose(1, 2)  # (B, T, Y)
        y_given_x = picked - x_marginal.gather(1, column)[..., None]  # log P(y | x)
        y = torch.where(is_x[..., None], y_given_x, click_map.logsumexp(2)[:, None, :])  # (B, T, Y)
        return MapScores(x_marginal[:, None, :].expand(-1, read_ids.shape[1], -1), y)

    def pointer_targets(self, vis: torch.Tensor, kept: torch.Tensor, kept_relevance: torch.Tensor) -> Pointer:
        """What the coordinate tokens point at, computed once per step (not once per decoded token).

        vis (B, k, d) kept visual tokens, kept (B, k) their raster indices, kept_relevance (B, k) theirs."""
        in_col = ((kept % self.cols)[..., None] == torch.arange(self.cols)).float()  # (B, k, C)
        in_row = ((kept // self.cols)[..., None] == torch.arange(self.rows)).float()  # (B, k, R)
        return Pointer(self.pointer_k(vis), (in_col - 1.0) * MEMBERSHIP, (in_row - 1.0) * MEMBERSHIP,
                       self.score_bias(kept_relevance))  # fmt: skip

    def score_bias(self, kept_relevance: torch.Tensor) -> torch.Tensor:
        """(..., k) what pointer_relevance adds to the pointer scores: scale * relevance (else zeros)."""
        if not self.cfg.pointer_relevance:
            return torch.zeros_like(kept_relevance)
        return self.pointer_scale * kept_relevance

    def output_logits(self, hidden: torch.Tensor, coordinates: Pointer | MapScores | None) -> torch.Tensor:
        """(B, T, d) final hidden states -> (B, T, V): the LM head, with coordinate ids scored by pointing or by
        the click map (None: the LM head alone, what a click-map model's decoder graphs compute)."""
        lm = self.decoder.lm_head(hidden)  # (B, T, V)
        if coordinates is None:
            return lm
        if isinstance(coordinates, MapScores):
            x_logits, y_logits = coordinates
        else:
            x_logits, y_logits = self.coordinate_logits(hidden, coordinates)
        end = self.y0 + y_logits.shape[-1]
        return torch.cat([lm[..., : self.x0], x_logits, y_logits, lm[..., end:]], dim=-1)

    def coordinate_logits(self, hidden: torch.Tensor, pointer: Pointer) -> tuple[torch.Tensor, torch.Tensor]:
        """Pointer logits of the x and y tokens: (B, T, cols * bpp) and (B, T, rows * bpp), bpp = bins per patch."""
        keys, col_bias, row_bias, score_bias = pointer
        s = torch.einsum("btr,bkr->btk", self.pointer_q(hidden), keys) / math.sqrt(keys.shape[-1])  # (B, T, k)
        s = s + score_bias[:, None, :]
        col = torch.logsumexp(s[..., None] + col_bias[:, None], dim=2)  # (B, T, C)
        row = torch.logsumexp(s[..., None] + row_bias[:, None], dim=2)  # (B, T, R)
        fine = self.fine(hidden)  # (B, T, 2 * bpp)
        fx, fy = fine[..., : self.bins_per_patch], fine[..., self.bins_per_patch :]
        x_logits = (col[..., None] + fx[..., None, :]).flatten(-2)  # (B, T, C * bpp)
        y_logits = (row[..., None] + fy[..., None, :]).flatten(-2)  # (B, T, R * bpp)
        return x_logits, y_logits
