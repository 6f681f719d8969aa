"""LoRA (peft) adapters on the VLA's decoder: what replaces full fine-tuning of a warm-started run
(`lora_rank > 0`), and their merge back into plain weights before export."""

from __future__ import annotations

from learner.model.vla import VLA


def apply_lora(model: VLA, rank: int, alpha: float) -> VLA:
    """Wrap the decoder with LoRA adapters on attention and MLP projections; freezes the base decoder."""
    from peft import LoraConfig, get_peft_model

    lora = LoraConfig(r=rank, lora_alpha=alpha, target_modules=["c_attn", "c_proj", "c_fc"], fan_in_fan_out=True)
    model.decoder = get_peft_model(model.decoder, lora)
    return model


def merge_lora(model: VLA) -> VLA:
    """Fold LoRA adapters into the decoder weights (a plain GPT2LMHeadModel again); no-op without adapters."""
    if hasattr(model.decoder, "merge_and_unload"):
        model.decoder = model.decoder.merge_and_unload()
    return model
