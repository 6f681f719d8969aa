"""The VLA's architecture (learner.model.vla): everything a checkpoint needs to rebuild the model, written into
every checkpoint and bundle as a dict that leaves out the options a model does not use."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields

from policy.pruning import grid_shape


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
    history_actions: int = 0
    """The latest actions of the episode the prompt carries (policy.tokens): the model's memory of what it did.
    0: none (the models before it)."""
    bin_px: int = 5
    """Pixels per coordinate token (must match the tokenizer's)."""
    encoder: str = "patch"
    """"patch" (raw-pixel patches, instruction only in the relevance query) or "reading" (FiLM and
    cross-attention on the instruction's characters inside a 2 px stem; see the module docstring)."""
    reading_channels: int = 64
    """"reading": channels C of the 10 px cells (the stem's 2 px layer has C / 2)."""
    reading_blocks: int = 4
    """"reading": residual 3x3 blocks over the 21x16 cells, each FiLM-conditioned."""
    reading_condition: bool = True
    """"reading": False drops FiLM and the cross-attention (the same stem, blind to the instruction: an ablation)."""
    max_instruction_chars: int = 96
    """"reading": characters of the instruction the encoder reads."""
    reading_global_layers: int = 0
    """"reading": self-attention layers over all 21x16 cells after the convolutions, so a cell's features can
    depend on what is anywhere on the screen (identify-shape: a button is right because of the figure 100 px
    away; the convolutions see +-45 px). 0: none (the models before it)."""
    pointer_relevance: bool = False
    """Add each kept patch's relevance (times a learned scale) to the coordinate tokens' pointer scores: the
    decoder then points where the encoder found what the instruction names, and refines from there."""
    click_map: bool = False
    """"reading" only: the click is a dense map on the encoder's cells, one logit per bin_px sub-cell of the
    whole screen under one joint softmax, computed before any pruning; it scores the coordinate tokens (x: its
    column marginal, y: the column the x token chose) and its cell marginal is the pruning relevance. False:
    the decoder's pointer over the kept tokens (the models before it)."""

    def to_dict(self) -> dict:
        # Options left off are left out, so models without them keep the config (and the bundle bytes) they had.
        data = {k: v for k, v in asdict(self).items() if v is not None}
        if self.encoder == "patch":
            for name in READING_FIELDS:
                data.pop(name, None)
        if not self.pointer_relevance:
            data.pop("pointer_relevance")
        if not self.click_map:
            data.pop("click_map")
        if not self.history_actions:
            data.pop("history_actions")
        if not self.reading_global_layers:
            data.pop("reading_global_layers", None)
        return data

    @classmethod
    def from_dict(cls, data: dict) -> VLAConfig:
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})

    @property
    def num_patches(self) -> int:
        rows, cols = grid_shape(self.patch_px)
        return rows * cols


READING_FIELDS = (
    "encoder",
    "reading_channels",
    "reading_blocks",
    "reading_condition",
    "max_instruction_chars",
    "reading_global_layers",
)
