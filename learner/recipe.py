"""A VLA recipe: the model, pruning, vocabulary and training settings a run starts from, as one JSON file.

configs/vla_demo.json (the demo's small VLA) and configs/vla_release.json (the release) are recipes; the
release's also lists its demonstrations. Every section is optional: what it leaves out keeps the defaults
of VLAConfig, PruningConfig and VLATrainConfig.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path

from learner.vla_sft import VLATrainConfig
from policy.pruning import PruningConfig

CONFIGS = Path(__file__).resolve().parents[1] / "configs"


@dataclass(frozen=True)
class VLARecipe:
    model: dict = field(default_factory=dict)
    """VLAConfig fields of a fresh model (learner.vla); vocab_size and bin_px come from the tokenizer."""
    pruning: PruningConfig = field(default_factory=PruningConfig)
    vocab_size: int = 1024
    """Size of the locally trained tokenizer's vocabulary, action tokens included."""
    train: VLATrainConfig = field(default_factory=VLATrainConfig)
    raw: dict = field(default_factory=dict)
    """The whole JSON (sections other programs read, e.g. the release's demonstrations)."""

    @classmethod
    def load(cls, path: str | Path, **train_overrides) -> VLARecipe:
        """A recipe file, or a name of one in configs/ ('demo' -> configs/vla_demo.json); overrides that are
        None keep the recipe's value."""
        if not Path(path).suffix and (CONFIGS / f"vla_{path}.json").exists():
            path = CONFIGS / f"vla_{path}.json"
        raw = json.loads(Path(path).read_text())
        return cls.from_dict(raw, **train_overrides)

    @classmethod
    def from_dict(cls, raw: dict, **train_overrides) -> VLARecipe:
        train = dict(raw.get("train", {}))
        if "keep_ratios" in train:
            train["keep_ratios"] = tuple(train["keep_ratios"])
        if "seed" in raw:
            train.setdefault("seed", int(raw["seed"]))
        unknown = set(train) - set(VLATrainConfig.__dataclass_fields__)
        if unknown:
            raise ValueError(f"unknown train settings {sorted(unknown)} (VLATrainConfig has no such fields)")
        config = replace(VLATrainConfig(**train), **{k: v for k, v in train_overrides.items() if v is not None})
        return cls(model=dict(raw.get("model", {})), pruning=PruningConfig(**raw.get("pruning", {})),
                   vocab_size=int(raw.get("vocab_size", 1024)), train=config, raw=raw)  # fmt: skip
