"""The shape every policy has, scripted expert or trained model alike."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from policy.sampling import Sampling
from schemas import Action


@dataclass(frozen=True)
class Observation:
    """What one step sees. Policies that learn may only use `screenshot` and `instruction`;
    `dom` is there for scripted experts (the DOM oracles) and for verification."""

    task: str
    instruction: str
    screenshot: np.ndarray  # (210, 160, 3) uint8, the task area
    dom: Any = None  # miniwob DOMElement root, or None
    step: int = 0


@dataclass(frozen=True)
class Decision:
    """Think -> act: the thought, the action, and what the screen should show afterwards."""

    thought: str
    action: Action
    expected: str = ""  # e.g. "screen changes near (80, 105)"; checked by edge_client.verify
    logprob: float | None = None  # behaviour log-probability of the action (None for experts)
    extras: dict[str, float] = field(default_factory=dict)  # e.g. visual token counts
    tokens: tuple[int, ...] = ()  # a model's generated target ids (thought + action, <eos> included)
    token_logprobs: tuple[float, ...] = ()  # log mu of each of `tokens` under the distribution it was drawn from
    sampling: Sampling | None = None  # how the tokens were drawn (None for experts)
    target_box: tuple[float, float, float, float] | None = None  # an expert click's element: left, top, right, bottom


class Policy(Protocol):
    version: str  # model_version recorded on every step ("expert" for scripted oracles)

    def act(self, obs: Observation) -> Decision: ...
