"""The learner scores a rollout's tokens as the edge drew them: on-policy, pi_theta / mu == 1 per token."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest
import torch

from learner.algorithms.policy_logprobs import action_positions, grammar_masks, token_logprobs
from learner.data.dataset import VLADataset
from learner.model.export import export_bundle
from learner.model.vla import VLA
from learner.model.vla_config import VLAConfig
from policy.pruning import PruningConfig
from policy.runtime import VLARuntime
from policy.sampling import Sampling
from policy.screen import encode_png
from policy.tokens import train_tokenizer

TINY_READING = {"d_model": 64, "n_layers": 2, "n_heads": 2, "d_ff": 128, "encoder": "reading",
                "reading_channels": 16, "reading_blocks": 1, "pointer_relevance": True}  # fmt: skip
INSTRUCTIONS = ["Click the button.", "Enter 'ok' into the text field.", "Click on the link 'Submit'."]


def screen(seed: int) -> np.ndarray:
    """A white screen with a few coloured boxes: something for pruning's prior to rank."""
    rng = np.random.default_rng(seed)
    image = np.full((210, 160, 3), 255, dtype=np.uint8)
    for _ in range(4):
        y, x = rng.integers(0, 190), rng.integers(0, 140)
        image[y : y + 20, x : x + 20] = rng.integers(0, 255, 3)
    return image


@pytest.fixture(scope="module")
def untrained(tmp_path_factory):
    torch.manual_seed(0)
    tok = train_tokenizer(INSTRUCTIONS + ["click", "type ok", "Enter"], vocab_size=300)
    model = VLA(VLAConfig(**TINY_READING, vocab_size=tok.vocab_size, bin_px=tok.bin_px)).eval()
    pruning = PruningConfig(keep_ratio=0.25)
    bundle = export_bundle(model, tok, pruning, tmp_path_factory.mktemp("bundle") / "model.vla")
    return model, tok, pruning, bundle


@pytest.mark.parametrize(
    "sampling",
    [Sampling(temperature=1.0, explore_thought=True), Sampling(temperature=2.0, top_k=5, explore_thought=True)],
)  # every token drawn
def test_the_learner_reproduces_the_edges_behaviour_logprobs(untrained, sampling):
    model, tok, pruning, bundle = untrained
    # Unpruned: with pruning, float32 noise between the two backends' relevance can swap one patch at the
    # top-k boundary, and its column's pointer logits move (the learner then scores a slightly different mu).
    runtime = VLARuntime(bundle, keep_ratio=1.0)
    rng = np.random.default_rng(0)
    rows, recorded = [], []
    for i in range(6):
        image, instruction = screen(i), INSTRUCTIONS[i % len(INSTRUCTIONS)]
        gen, _ = runtime.step(image, instruction, None, sampling, rng)
        parsed = tok.parse(gen.ids)
        rows.append(dict(episode_id=f"e{i}", step=0, task="t", instruction=instruction, screenshot=encode_png(image),
                         thought=parsed.thought, action_type=parsed.action.type, x=parsed.action.x, y=parsed.action.y,
                         text=parsed.action.text, key=parsed.action.key, tokens=gen.ids))  # fmt: skip
        recorded.append(gen.token_logprobs)
    data = VLADataset(pl.DataFrame(rows), tok, model.cfg, pruning)
    batch = data.batch(np.arange(len(rows)))
    masks = grammar_masks(tok, batch["labels"], model.cfg.max_thought_tokens)
    with torch.no_grad():
        logp, logp_all, mask, _ = token_logprobs(model, batch, masks, model.cfg.num_patches)
    for row, expected in enumerate(recorded):
        learner = logp[row][mask[row] > 0].numpy()
        assert len(learner) == len(expected)
        if sampling.temperature == 1.0 and not sampling.top_k:  # on-policy: the ratio is 1 at every token
            # (float32 onnxruntime vs torch kernels differ by ~1e-3 in a log-prob; PPO clips at 0.2)
            assert np.exp(learner - np.array(expected)) == pytest.approx(np.ones(len(expected)), abs=5e-3)
        else:  # tempered / truncated behaviour: a ratio the learner must correct for
            assert np.abs(learner - np.array(expected)).max() > 0.1
    assert torch.isfinite(logp).all() and torch.isneginf(logp_all).any()  # outside the grammar


def test_recorded_tokens_refuse_augmented_views(untrained):
    model, tok, pruning, _ = untrained
    row = dict(episode_id="e", step=0, task="t", instruction="Click", screenshot=encode_png(screen(0)), thought="",
               action_type="click", x=1.0, y=1.0, text="", key="", tokens=[tok.act_id, tok.eos_id])  # fmt: skip
    from learner.recipe import Augmentation

    data = VLADataset(pl.DataFrame([row]), tok, model.cfg, pruning)
    with pytest.raises(ValueError, match="cannot be augmented"):
        data.batch(np.arange(1), np.random.default_rng(0), Augmentation(shift_px=4))


def test_the_action_positions_are_those_after_act():
    act, ignore = 3, -100
    labels = torch.tensor([[ignore, 7, 8, act, 9, 10, 4], [ignore, ignore, act, 11, 4, ignore, ignore]])
    assert action_positions(labels, act).tolist() == [[0, 0, 0, 0, 1, 1, 1], [0, 0, 0, 1, 1, 0, 0]]
