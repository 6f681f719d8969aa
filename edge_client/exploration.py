"""How the fleet explores a task nobody demonstrated: K rollouts of each seed, on a ladder of temperatures whose top
the task's own success sets.

On a new task there is no expert and no teacher; the only signal is the episode's verified ending. A policy trained
elsewhere is nearly deterministic there (the release, sampled at temperature 1 over every token, 8 runs on each of
20 seeds: no success at all on three of the eight new tasks), so the fleet's usual narrow sampling (temperature 0.7
among the top 5) would replay the same failure. Each new task is sampled over every token, its K runs of a seed
on a ladder from T_low up to a top that falls as the task's success under the current version rises:

    top(task) = T_high - (T_high - T_low) * successes / runs    (no run yet: T_high)
    T_k       = T_low + (top - T_low) * k / (K - 1)             (run k = 0 .. K-1 of a seed)

Why a ladder, not one temperature: the tasks want different ones. The release, 4 runs on each of 10 seeds a task,
pass@4 at T = 1 / 2 / 3: click-pie 0.10 / 0.20 / 0.40 (a click far from its habit), enter-text-dynamic
0.10 / 0.00 / 0.00 (typed characters at a high temperature are noise), docs/new_tasks.md. A task the version never
solves gets the widest ladder, where every success is news; one it solves is sampled near its own choice, so its
successes are the version's habits made surer. The rate is this client's own count under the version it runs (it
starts again at a swap), which needs no coordination between clients.

Where the fleet's time goes: a visit to a new task runs all its seeds only while the task is worth them, where a
success was ever found (so pass@K > 0) and the running version does not solve it yet (under SOLVED of its runs).
Elsewhere a visit runs one seed: a task without a success gets its K runs and the search from their failure
(edge_client.search) before it gets more fleet time; a solved one is only checked on.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field, replace

from policy.sampling import Sampling

SOLVED = 0.95  # a version solves a task whose runs succeed this often ...
SOLVED_AFTER = 16  # ... over at least this many of them


def temperature_for(successes: int, runs: int, high: float, low: float, rung: int = 0, rungs: int = 1) -> float:
    """Run `rung` of `rungs`' temperature: from `low` (rung 0) up to the top, T_high - (T_high - T_low) * the
    success rate (T_high before any run); one rung: the top."""
    rate = successes / runs if runs else 0.0
    top = high - (high - low) * rate
    return top if rungs <= 1 else low + (top - low) * rung / (rungs - 1)


@dataclass
class NewTaskSampler:
    """The sampling of each new task's next episode, from the client's own tally of its endings."""

    high: float
    low: float
    tally: dict[tuple[str, str], list[int]] = field(default_factory=lambda: defaultdict(lambda: [0, 0]))
    """(task, model version) -> [successes, runs]."""
    found: set[str] = field(default_factory=set)
    """Tasks with a success found on them, by any version, sampled or searched."""

    def sampling(self, task: str, version: str, base: Sampling, repeat: int, repeats: int) -> Sampling:
        """`base` (the client's sampler) over every token, at run `repeat` of `repeats`' temperature on the task's
        ladder."""
        successes, runs = self.tally[task, version]
        temperature = temperature_for(successes, runs, self.high, self.low, repeat, repeats)
        return replace(base, temperature=temperature, top_k=0)

    def record(self, task: str, version: str, success: bool) -> None:
        counts = self.tally[task, version]
        counts[0] += int(success)
        counts[1] += 1
        if success:
            self.found.add(task)

    def worth_all_seeds(self, task: str, version: str) -> bool:
        """Whether a visit to `task` runs all its seeds: a success was found on it, and `version` does not solve it
        yet (a success rate under SOLVED over at least SOLVED_AFTER runs)."""
        successes, runs = self.tally[task, version]
        solved = runs >= SOLVED_AFTER and successes >= SOLVED * runs
        return task in self.found and not solved
