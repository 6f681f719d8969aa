"""Exploration at the edge: sampling under the action grammar, and the behaviour log-probs it records."""

from __future__ import annotations

import numpy as np
import pytest

from policy.sampling import GREEDY, Sampling, behaviour_distribution, generate
from policy.screen import log_softmax
from policy.tokens import train_tokenizer
from schemas import Action

MAX_THOUGHT = 6


@pytest.fixture(scope="module")
def tok():
    return train_tokenizer(["click the button", "Submit", "ok", "type the text", "Enter"], vocab_size=300)


def fixed_logits(tok, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).normal(0.0, 2.0, tok.vocab_size).astype(np.float32)


def test_behaviour_distribution_is_the_tempered_top_k_softmax_of_the_allowed_tokens():
    logits = np.array([2.0, 1.0, 0.0, -np.inf, 3.0])  # token 3 is outside the grammar
    log_mu = behaviour_distribution(logits, Sampling(temperature=2.0, top_k=2))
    # top-2 of the allowed logits / 2 are tokens 4 (1.5) and 0 (1.0): softmax over those two only
    expected = np.exp([1.0, 1.5]) / np.exp([1.0, 1.5]).sum()
    assert np.exp(log_mu[[0, 4]]) == pytest.approx(expected)
    assert np.isneginf(log_mu[[1, 2, 3]]).all()
    assert np.exp(behaviour_distribution(logits, Sampling(temperature=1.0))).sum() == pytest.approx(1.0)


def test_sampled_first_tokens_follow_the_recorded_distribution(tok):
    logits = fixed_logits(tok)
    sampling = Sampling(temperature=1.5, top_k=5, explore_thought=True)
    rng = np.random.default_rng(1)
    allowed = tok.allowed_next([], MAX_THOUGHT, 24)
    log_mu = behaviour_distribution(np.where(allowed, logits, -np.inf), sampling)
    counts = np.zeros(tok.vocab_size)
    for _ in range(3000):
        gen = generate(logits, lambda _t: logits, tok, MAX_THOUGHT, sampling, rng)
        counts[gen.ids[0]] += 1
        assert gen.token_logprobs[0] == pytest.approx(log_mu[gen.ids[0]])
    assert set(np.flatnonzero(counts)) <= set(np.flatnonzero(np.isfinite(log_mu)))  # only the top 5 are drawn
    assert np.abs(counts / counts.sum() - np.exp(log_mu)).max() < 0.03


def test_by_default_the_thought_is_greedy_and_only_the_action_explores(tok):
    """Without explore_thought every sample shares the greedy thought (each token recorded with the model's own
    log-probability at temperature 1), and the actions still vary."""
    logits = fixed_logits(tok)
    rng = np.random.default_rng(3)
    samples = [generate(logits, lambda _t: logits, tok, MAX_THOUGHT, Sampling(temperature=1.5, top_k=5), rng)
               for _ in range(50)]  # fmt: skip
    thoughts = {tuple(g.ids[: g.ids.index(tok.act_id) + 1]) for g in samples}
    assert len(thoughts) == 1
    greedy = generate(logits, lambda _t: logits, tok, MAX_THOUGHT, GREEDY)
    cut = greedy.ids.index(tok.act_id) + 1
    assert samples[0].ids[:cut] == greedy.ids[:cut]
    assert samples[0].token_logprobs[:cut] == pytest.approx(greedy.token_logprobs[:cut])
    assert len({tuple(g.ids[cut:]) for g in samples}) > 1


def test_every_sample_parses_and_the_action_logprob_sums_its_action_tokens(tok):
    rng = np.random.default_rng(2)
    seen = set()
    for seed in range(200):
        steps = iter(range(1000 + 100 * seed, 1100 + 100 * seed))
        gen = generate(fixed_logits(tok, seed), lambda _t, steps=steps: fixed_logits(tok, next(steps)), tok,
                       MAX_THOUGHT, Sampling(temperature=1.0, explore_thought=True), rng)  # fmt: skip
        parsed = tok.parse(gen.ids)
        seen.add(parsed.action.type)
        start = gen.ids.index(tok.act_id)
        assert gen.action_logprob == pytest.approx(sum(gen.token_logprobs[start:]))
        assert len(gen.token_logprobs) == len(gen.ids) and all(lp <= 0.0 for lp in gen.token_logprobs)
    assert len(seen) >= 3  # exploration reaches several action types


def test_greedy_takes_the_argmax_and_records_the_model_logprob(tok):
    logits = fixed_logits(tok)
    gen = generate(logits, lambda _t: logits, tok, MAX_THOUGHT, GREEDY)
    allowed = tok.allowed_next([], MAX_THOUGHT, 24)
    masked = np.where(allowed, logits, -np.inf)
    assert gen.ids[0] == int(np.argmax(masked))
    assert gen.token_logprobs[0] == pytest.approx(log_softmax(masked)[gen.ids[0]])
    assert gen.ids == generate(logits, lambda _t: logits, tok, MAX_THOUGHT).ids  # deterministic


def test_bad_sampling_settings_are_refused(tok):
    with pytest.raises(ValueError, match="temperature"):
        Sampling(temperature=-1.0)
    with pytest.raises(ValueError, match="top_k"):
        Sampling(temperature=1.0, top_k=-2)
    with pytest.raises(ValueError, match="rng"):
        generate(fixed_logits(tok), lambda _t: fixed_logits(tok), tok, MAX_THOUGHT, Sampling(temperature=1.0))


def test_the_step_event_carries_the_tokens_and_their_logprobs():
    from schemas import EventDecodeError, StepEvent, Verify, decode_event, encode_event

    event = StepEvent(event_id="e", client_id="c", produced_at=1.0, episode_id="ep", step=0, task="click-test",
                      instruction="Click", screenshot=b"", thought="t", action=Action("click", 1.0, 2.0),
                      model_version="v", verify=Verify(), reward=0.0, done=False, behaviour_logprob=-0.5,
                      tokens=(5, 6, 7), token_logprobs=(-0.1, -0.2, -0.3), temperature=1.0, top_k=10)  # fmt: skip
    back = decode_event(encode_event(event))
    assert back.tokens == (5, 6, 7) and back.token_logprobs == pytest.approx((-0.1, -0.2, -0.3))
    assert (back.temperature, back.top_k) == (1.0, 10)
    import msgspec

    bad = msgspec.msgpack.encode({**msgspec.structs.asdict(event), "kind": "step", "action": {"type": "click"},
                                  "token_logprobs": [0.5]})  # fmt: skip
    with pytest.raises(EventDecodeError, match="token_logprobs"):
        decode_event(bad)
