"""The VLA in PyTorch eager mode with transformers `generate`: the reference the edge runtime is checked
and benchmarked against. Same preprocessing, pruning and action grammar as edge_client.vla_runtime."""

from __future__ import annotations

import time

import numpy as np
import torch
from transformers import LogitsProcessor, LogitsProcessorList

from edge_client.preprocess import log_softmax, screenshot_to_chw
from edge_client.pruning import PruningConfig, keep_count, patch_prior, select_patches
from edge_client.vla_runtime import MAX_TEXT_TOKENS, Generation, StepTiming
from edge_client.vla_tokens import ActionTokenizer
from learner.vla import VLA


class GrammarProcessor(LogitsProcessor):
    """Masks logits to what ActionTokenizer.allowed_next permits after the tokens generated so far."""

    def __init__(self, tok: ActionTokenizer, max_thought_tokens: int, prompt_len: int):
        self.tok = tok
        self.max_thought_tokens = max_thought_tokens
        self.prompt_len = prompt_len  # generate's input_ids hold only new tokens when it is given inputs_embeds

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        for row in range(scores.shape[0]):
            allowed = self.tok.allowed_next(input_ids[row, self.prompt_len :].tolist(), self.max_thought_tokens,
                                            MAX_TEXT_TOKENS)  # fmt: skip
            scores[row, torch.from_numpy(~allowed)] = float("-inf")
        return scores


@torch.inference_mode()
def torch_step(
    model: VLA,
    tok: ActionTokenizer,
    pruning: PruningConfig,
    screenshot: np.ndarray,
    instruction: str,
    previous: np.ndarray | None,
    max_new_tokens: int = 64,
) -> tuple[Generation, StepTiming]:
    """One step, greedy, in PyTorch eager mode: the twin of VLARuntime.step."""
    cfg = model.cfg
    t0 = time.perf_counter()
    prompt = tok.prompt_ids(instruction, cfg.max_instruction_tokens)
    image = torch.from_numpy(screenshot_to_chw(screenshot)[None])
    encoded = model.encode(image, torch.tensor([prompt[1:-1] or [0]]))
    prior = patch_prior(screenshot, previous, cfg.patch_px, pruning)
    kept = select_patches(encoded.relevance[0].numpy(), prior, keep_count(cfg.num_patches, pruning.keep_ratio))
    embeds = torch.cat([encoded.patches[0, torch.from_numpy(kept)], model.wte(torch.tensor(prompt))])[None]
    t1 = time.perf_counter()
    out = model.decoder.generate(
        inputs_embeds=embeds,
        attention_mask=torch.ones(embeds.shape[:2], dtype=torch.long),
        max_new_tokens=max_new_tokens,
        do_sample=False,
        logits_processor=LogitsProcessorList([GrammarProcessor(tok, cfg.max_thought_tokens, 0)]),
        eos_token_id=tok.eos_id,
        pad_token_id=tok.pad_id,
        output_scores=True,
        return_dict_in_generate=True,
    )
    t2 = time.perf_counter()
    ids = out.sequences[0].tolist()
    logprob, in_action = 0.0, False
    for token, scores in zip(ids, out.scores, strict=False):
        in_action = in_action or token == tok.act_id
        if in_action:
            logprob += float(log_softmax(scores[0].double().numpy())[token])
    # generate fuses prefill and decoding; its first token's time is reported as the prefill.
    timing = StepTiming((t1 - t0) * 1e3, 0.0, (t2 - t1) * 1e3, len(ids) - 1, cfg.num_patches, len(kept))
    return Generation(ids, logprob, len(ids) - 1), timing
