"""How the fleet explores a task nobody demonstrated: K rollouts of each seed, at a temperature the task's own
success sets.

On a new task there is no expert and no teacher; the only signal is the episode's verified ending. A policy trained
elsewhere is nearly deterministic there (the release, sampled at temperature 1 over every token, 8 runs on each of
20 seeds: no success at all on three of the eight new tasks), so the fleet's usual narrow sampling (temperature 0.7
among the top 5) would replay the same failure. Each new task is sampled over every token at a temperature that
falls as the task's success under the current version rises:

    T(task) = T_high - (T_high - T_low) * successes / runs      (no run yet: T_high)

A task the version never solves is explored widely, where every success is news; one it solves is sampled near
its own greedy choice, so its successes are the version's habits made surer, not noise. The rate is this client's
own count under the version it runs (it starts again at a swap), which needs no coordination between clients.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field, replace

from policy.sampling import Sampling


def temperature_for(successes: int, runs: int, high: float, low: float) -> float:
    """T_high - (T_high - T_low) * the success rate; T_high before any run."""
    rate = successes / runs if runs else 0.0
    return high - (high - low) * rate


@dataclass
class NewTaskSampler:
    """The sampling of each new task's next episode, from the client's own tally of its endings."""

    high: float
    low: float
    tally: dict[tuple[str, str], list[int]] = field(default_factory=lambda: defaultdict(lambda: [0, 0]))
    """(task, model version) -> [successes, runs]."""

    def sampling(self, task: str, version: str, base: Sampling) -> Sampling:
        """`base` (the client's sampler) at the task's temperature, over every token."""
        successes, runs = self.tally[task, version]
        return replace(base, temperature=temperature_for(successes, runs, self.high, self.low), top_k=0)

    def record(self, task: str, version: str, success: bool) -> None:
        counts = self.tally[task, version]
        counts[0] += int(success)
        counts[1] += 1
