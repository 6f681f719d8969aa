"""The VLA in PyTorch eager mode: the reference the edge runtime is checked and benchmarked against.

The transformers GPT-2 forward with its own KV cache, one token per call, greedy under the same action
grammar (policy.sampling.generate), same preprocessing and pruning. transformers' `generate`
cannot be used as is: the coordinate tokens are scored by the model's pointer head or click map, not by its LM head.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import numpy as np
import torch
from transformers import DynamicCache

from learner.model.vla import VLA
from policy.pruning import MAP_TOP_CELLS, PruningConfig, keep_count, patch_prior, select_patches
from policy.runtime import StepTiming
from policy.sampling import Generation, generate
from policy.screen import screenshot_to_chw
from policy.tokens import ActionTokenizer, char_ids
from schemas import Action


@torch.inference_mode()
def torch_step(
    model: VLA,
    tok: ActionTokenizer,
    pruning: PruningConfig,
    screenshot: np.ndarray,
    instruction: str,
    previous: np.ndarray | None,
    history: Sequence[Action] = (),
) -> tuple[Generation, StepTiming]:
    """One step, greedy, in PyTorch eager mode: the twin of VLARuntime.step."""
    cfg = model.cfg
    t0 = time.perf_counter()
    prompt = tok.prompt_ids(instruction, cfg.max_instruction_tokens, history, cfg.history_actions)
    image = torch.from_numpy(screenshot_to_chw(screenshot)[None])
    chars = torch.tensor([char_ids(instruction, cfg.max_instruction_chars)])
    encoded = model.encode(image, torch.tensor([tok.instruction_ids(instruction, cfg.max_instruction_tokens) or [0]]),
                           chars)  # fmt: skip
    prior = patch_prior(screenshot, previous, cfg.patch_px, pruning)
    kept = select_patches(encoded.relevance[0].numpy(), prior, keep_count(cfg.num_patches, pruning.keep_ratio),
                          MAP_TOP_CELLS if cfg.click_map else 0)  # fmt: skip
    kept_t = torch.from_numpy(kept)[None]
    visual = encoded.patches[:, kept_t[0]]  # (1, k, d)
    embeds = torch.cat([visual, model.wte(torch.tensor([prompt]))], dim=1)
    t1 = time.perf_counter()
    # transformers' documented cache API: a DynamicCache passed as past_key_values grows in place per call.
    cache = DynamicCache()
    out = model.decoder.transformer(inputs_embeds=embeds, past_key_values=cache, use_cache=True)
    if cfg.click_map:  # the coordinates scored by the map, given the token each position reads

        def coordinates(read: int):
            return model.map_scores(encoded.click_map, torch.tensor([[read]]))
    else:
        pointer = model.pointer_targets(visual, kept_t, encoded.relevance[:, kept_t[0]])

        def coordinates(read: int):
            return pointer

    first = model.output_logits(out.last_hidden_state[:, -1:], coordinates(prompt[-1]))[0, 0].numpy()
    t2 = time.perf_counter()

    def advance(token: int) -> np.ndarray:
        step = model.decoder.transformer(inputs_embeds=model.wte(torch.tensor([[token]])), past_key_values=cache,
                                         use_cache=True)  # fmt: skip
        return model.output_logits(step.last_hidden_state, coordinates(token))[0, 0].numpy()

    gen = generate(first, advance, tok, cfg.max_thought_tokens)
    t3 = time.perf_counter()
    return gen, StepTiming((t1 - t0) * 1e3, (t2 - t1) * 1e3, (t3 - t2) * 1e3, gen.steps, cfg.num_patches, len(kept))
