"""Decoding under the action grammar: greedy (eval) or sampled (exploration), with the behaviour log-probs.

Every generated token is drawn from

    mu(token | prefix) = softmax(top_k(masked_logits / temperature))      (masked: ActionTokenizer.allowed_next)

and its log mu is recorded: the learner's importance ratios pi_theta / mu need the distribution the token
was actually drawn from, not the model's. Exploration is in the action: the thought (everything before
<act>, the choice to end it included) is decoded greedily unless `explore_thought` (thoughts sampled
at temperature 1 among the top 5 drifted into babble under RL within 20 PPO updates, and the actions read
after them with it). Greedy decoding is deterministic, so there is no behaviour density to record; a greedy
token records the model's own log-probability at temperature 1 instead, which is what `behaviour_logprob`
has always meant for greedy rollouts.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from policy.screen import log_softmax

if TYPE_CHECKING:  # the Policy interface imports Sampling; experts need no tokenizer
    from policy.tokens import ActionTokenizer

MAX_TEXT_TOKENS = 24  # typed text / key name
MAX_NEW_TOKENS = 64  # thought + action


@dataclass(frozen=True)
class Sampling:
    """How the edge picks each token: temperature 0 is greedy (eval's default); top_k 0 keeps every allowed token."""

    temperature: float = 0.0
    top_k: int = 0
    seed: int | None = None  # the sampler's seed (None: fresh entropy per policy)
    explore_thought: bool = False  # sample the thought tokens too (False: the thought is greedy)

    def __post_init__(self):
        if self.temperature < 0:
            raise ValueError(f"sampling temperature must be >= 0, got {self.temperature}")
        if self.top_k < 0:
            raise ValueError(f"sampling top_k must be >= 0, got {self.top_k}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


GREEDY = Sampling()


@dataclass(frozen=True)
class Generation:
    """What one decode produced."""

    ids: list[int]  # generated target ids, <eos> included
    action_logprob: float  # sum of token_logprobs from <act> on: the behaviour log-probability of the action
    steps: int  # decoder calls after the prefill
    token_logprobs: list[float] = field(default_factory=list)  # (len(ids),) log mu of each generated token


def behaviour_distribution(masked_logits: np.ndarray, sampling: Sampling) -> np.ndarray:
    """(V,) log mu over the vocabulary: temperature-scaled, top-k-truncated, grammar-masked (-inf outside)."""
    z = masked_logits.astype(np.float64) / sampling.temperature  # (V,)
    allowed = np.isfinite(z)
    if sampling.top_k and sampling.top_k < int(allowed.sum()):
        kth = np.partition(z[allowed], -sampling.top_k)[-sampling.top_k]
        z = np.where(z >= kth, z, -np.inf)  # ties at the k-th value stay in: the support is what is recorded
    return log_softmax(z)


def generate(
    first_logits: np.ndarray,  # (V,) logits after the prefill
    advance: Callable[[int], np.ndarray],  # feed one token, get the next (V,) logits
    tok: ActionTokenizer,
    max_thought_tokens: int,
    sampling: Sampling = GREEDY,
    rng: np.random.Generator | None = None,
    max_new_tokens: int = MAX_NEW_TOKENS,
) -> Generation:
    """Decode one thought + action under the action grammar; backend-agnostic (onnxruntime or torch)."""
    if not sampling.greedy and rng is None:
        raise ValueError("sampled decoding needs an rng")
    ids: list[int] = []
    token_logprobs: list[float] = []
    logits = first_logits
    while True:
        allowed = tok.allowed_next(ids, max_thought_tokens, MAX_TEXT_TOKENS)
        masked = np.where(allowed, logits.astype(np.float64), -np.inf)
        if sampling.greedy or (not sampling.explore_thought and tok.act_id not in ids):
            token = int(np.argmax(masked))
            logprob = float(log_softmax(masked)[token])
        else:
            log_mu = behaviour_distribution(masked, sampling)
            token = int(rng.choice(len(log_mu), p=np.exp(log_mu)))
            logprob = float(log_mu[token])
        ids.append(token)
        token_logprobs.append(logprob)
        if token == tok.eos_id or len(ids) >= max_new_tokens:
            start = ids.index(tok.act_id) if tok.act_id in ids else len(ids)
            return Generation(ids, float(sum(token_logprobs[start:])), len(ids) - 1, token_logprobs)
        logits = advance(token)
