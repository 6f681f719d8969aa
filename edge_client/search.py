"""Search from the policy's own failures: successes the policy can distil, found without a demonstration.

Where the policy failed a (task, seed), the search resets the same seed, replays the failed episode's prefix, takes
one of the policy's other likely actions at a failing step, and lets the policy itself (or, within a budget of
calls, the teacher) finish the episode. The episodes that succeed are kept for filtered BC, as Pix2Act did with
the policy's top candidates and reward-filtered episodes; where the teacher finished one, only its steps are
targets (`targets_from`), the policy's failing prefix and candidate their history.

    failed episode   a0 a1 a2 -> failure
    branch at 2      a0 a1 c  -> policy ... -> success?    c: the policy's likeliest actions at step 2 other than a2
    branch at 1      a0 c' -> policy ...

Branches go from the latest failing step back. A reset must reproduce the failed episode's screens: a replayed
screen that differs from the recorded one (beyond the rasteriser's noise) stops the search of that episode, since
its successes would not be the policy's states. Evaluation seeds are never searched.

`continue_by_teacher` is the same replay with no candidate: the teacher's own trajectory from a step of the
policy's episode, DAgger's labels with a history the teacher would have produced.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from core.settings import EVAL_SEED
from edge_client.env import screen_difference
from edge_client.episode import Env, EpisodeResult, run_episode
from policy.elements import element_centres
from policy.interface import Decision, Observation, Policy
from policy.sampling import Sampling
from policy.screen import POSITIONAL_TYPES
from schemas import Action


@dataclass(frozen=True)
class SearchBudget:
    """What one failed episode's search may spend."""

    candidates: int = 3
    """Other actions tried at each failing step: the policy's likeliest, by their action log-probability."""
    draws: int = 16
    """Actions sampled (at `temperature`, among the policy's top 5 tokens) to find those candidates."""
    distinct_px: float = 10.0
    """A candidate click this close (in x and in y) to the action taken or to a likelier candidate is the same
    place (another pixel of the same link, a 5 px bin away): skipped."""
    temperature: float = 5.0
    """Flattens the policy's distribution for the draws, so that a confident policy still shows its second
    choices (the release puts log-probability -0.00 on its first click at temperature 1 and 2, and shows four
    other actions in 8 draws at 5); they are ranked by their log-probability all the same."""
    branch_steps: int = 2
    """Failing steps branched at, the latest first."""
    simulations: int = 6
    """Branches run (each a reset, the replayed prefix and a completion)."""
    env_steps: int = 60
    """Environment steps over all branches, replays included: a branch starts only while its prefix and
    candidate fit (a running branch may finish past it, by at most max_steps)."""
    teacher_calls: int = 0
    """Teacher actions over all branches (0: the policy completes every branch, no teacher)."""
    element_candidates: int = 0
    """Clicks on the screen's elements, read from its pixels (policy.elements), tried after the policy's own
    candidates at each failing step: where the policy never learned to want what a new task asks for, its own
    second choices miss it (0: the policy's candidates only)."""


@dataclass
class SearchResult:
    """One failed episode's search: the successes found and what they cost."""

    task: str
    seed: int
    successes: list[EpisodeResult] = field(default_factory=list)
    targets_from: list[int] = field(default_factory=list)
    """Each success's first step worth imitating: 0 where the policy finished the branch itself (the whole episode
    is its own), else the teacher's first step. The teacher recovers from any candidate, a noop included, so a
    teacher-finished success says nothing for the policy's prefix and candidate: they are its context only."""
    simulations: int = 0
    env_steps: int = 0
    teacher_calls: int = 0
    stopped: str = ""  # why the search ended early: "nondeterministic", a budget's name, or "" when it ran out


def candidate_actions(policy, obs: Observation, previous: np.ndarray | None, history: Sequence[Action],
                      taken: Action, budget: SearchBudget, rng: np.random.Generator,
                      skip_types: tuple[str, ...] = ()) -> list[Action]:  # fmt: skip
    """The policy's likeliest actions at `obs` other than `taken`: `budget.draws` samples among the top 5 tokens,
    distinct actions ranked by their log-probability (under the flattened draw: the same order token by token),
    the best `budget.candidates` that are not in the same place as the action taken or a likelier candidate, nor
    of a type in `skip_types`."""
    runtime = policy.runtime  # a VLAPolicy's: a stateless step from (screen, previous frame, history)
    sampling = Sampling(temperature=budget.temperature, top_k=5)
    best: dict[Action, float] = {}
    for _ in range(budget.draws):
        gen, _timing = runtime.step(obs.screenshot, obs.instruction, previous, sampling, rng, history)
        action = runtime.tok.parse(gen.ids).action
        best[action] = max(best.get(action, -np.inf), gen.action_logprob)
    chosen: list[Action] = []
    for action in sorted(best, key=best.get, reverse=True):
        if action.type in skip_types:
            continue
        if not any(same_place(action, other, budget.distinct_px) for other in [taken, *chosen]):
            chosen.append(action)
    chosen = chosen[: budget.candidates]
    elements = [Action(type="click", x=x, y=y) for x, y in element_centres(obs.screenshot)]
    for action in elements if budget.element_candidates else []:
        if len(chosen) >= budget.candidates + budget.element_candidates:
            break
        if not any(same_place(action, other, budget.distinct_px) for other in [taken, *chosen]):
            chosen.append(action)
    return chosen


def same_place(a: Action, b: Action, within_px: float) -> bool:
    """The same action, or clicks (any positional type alike) closer than `within_px` in x and in y."""
    if a.type in POSITIONAL_TYPES and b.type == a.type:
        return abs(a.x - b.x) < within_px and abs(a.y - b.y) < within_px
    return a == b


class Branch:
    """A policy that takes `forced` decisions first (the replayed prefix, then the candidate), then finishes the
    episode: by `teacher` while it has calls left, else by `policy`. Every action the policy did not choose itself
    is told to it (`remember`), so its history and previous frame are the branch's when it acts. A forced step
    keeps its thought: a success is imitated whole, and the thought of a searched step is the one the policy had
    there (it named the right target and pointed wrong, or the candidate would not differ)."""

    def __init__(self, forced: Sequence[Decision], policy, teacher: Policy | None = None, teacher_calls: int = 0):
        self.forced, self.policy, self.teacher, self.teacher_calls = list(forced), policy, teacher, teacher_calls
        self.version = policy.version
        self.screens: list[np.ndarray] = []  # the screens of the forced steps, to check the replay against
        self.calls = 0  # teacher actions taken

    def act(self, obs: Observation) -> Decision:
        if obs.step < len(self.forced):
            self.screens.append(obs.screenshot)
            decision = self.forced[obs.step]
        elif self.teacher is not None and self.calls < self.teacher_calls:
            self.calls += 1
            decision = self.teacher.act(obs)
        else:
            return self.policy.act(obs)
        self.policy.remember(obs, decision.action)
        return decision


def failing_steps(failed: EpisodeResult) -> list[int]:
    """Where to branch, latest first: the steps whose screen did not do what was expected, else every step; each
    moved to the first step that showed the same screen (a policy stuck on one screen for nine steps is branched
    where it first saw it: the same state, at a tenth of the replay, and a shorter success)."""
    unverified = [r.step for r in failed.records if not r.verify.ok]
    screens = [r.obs.screenshot for r in failed.records]
    first_seen = [next(i for i in range(j + 1) if screen_difference(screens[i], screens[j]) is None)
                  for j in range(len(screens))]  # fmt: skip
    steps = sorted(unverified or [r.step for r in failed.records], reverse=True)
    return list(dict.fromkeys(first_seen[j] for j in steps))


def search_failure(env: Env, policy, failed: EpisodeResult, budget: SearchBudget, seed: int = 0,
                   teacher: Policy | None = None, max_steps: int = 10) -> SearchResult:  # fmt: skip
    """Search the failed episode `failed` (run greedily by `policy`, a VLAPolicy) for successes. `teacher` (which
    needs an env that reads the DOM) finishes the branches while budget.teacher_calls last, the policy after."""
    if failed.seed >= EVAL_SEED:
        raise ValueError(f"seed {failed.seed} is an evaluation seed (>= {EVAL_SEED}): never searched")
    if failed.success:
        raise ValueError(f"{failed.task} seed {failed.seed} succeeded: there is no failure to search")
    out, rng = SearchResult(failed.task, failed.seed), np.random.default_rng(seed)
    taken = [r.decision for r in failed.records]
    for j in failing_steps(failed)[: budget.branch_steps]:
        record = failed.records[j]
        previous = failed.records[j - 1].obs.screenshot if j else None
        history, action = [d.action for d in taken[:j]], taken[j].action
        # With a teacher to finish, a noop is no alternative: the teacher would solve the failing screen behind it,
        # labels the greedy policy never reaches (122 of 147 such successes in a measured run).
        skip = ("noop",) if teacher is not None else ()
        for candidate in candidate_actions(policy, record.obs, previous, history, action, budget, rng, skip):
            if out.simulations >= budget.simulations:
                out.stopped = "simulations"
                return out
            if out.env_steps + j + 1 > budget.env_steps:
                out.stopped = "env_steps"
                return out
            searched = Decision(taken[j].thought, candidate)
            branch = Branch([*taken[:j], searched], policy, teacher, budget.teacher_calls - out.teacher_calls)
            result = run_branch(env, branch, failed, max_steps)
            out.simulations += 1
            out.env_steps += result.steps
            out.teacher_calls += branch.calls
            if not reproduced(branch, failed):
                out.stopped = "nondeterministic"  # the reset did not reproduce the policy's states
                return out
            if result.success:
                out.successes.append(result)
                out.targets_from.append(j + 1 if branch.calls else 0)
                break  # one success a failing step: the next step back may find another way
    return out


def run_branch(env: Env, branch: Branch, failed: EpisodeResult, max_steps: int) -> EpisodeResult:
    """`branch` run from a reset of the failed episode's seed."""
    return run_episode(env, branch, failed.task, failed.seed, max_steps=max_steps)


def reproduced(branch: Branch, failed: EpisodeResult) -> bool:
    """Whether every replayed screen of `branch` is the failed episode's (up to the rasteriser's noise)."""
    replayed = [r.obs.screenshot for r in failed.records[: len(branch.screens)]]
    return not any(screen_difference(a, b) for a, b in zip(branch.screens, replayed, strict=True))


def continue_by_teacher(env: Env, policy, episode: EpisodeResult, at: int, teacher: Policy,
                        max_steps: int = 10) -> EpisodeResult | None:  # fmt: skip
    """The teacher's own trajectory from step `at` of `episode`: the same seed reset, the policy's
    actions before `at` replayed, then the teacher to the end. Its steps from `at` on are labels whose history is
    the teacher's, never the policy's wrong clicks after `at`. None where the reset did not reproduce the
    episode's screens; the caller keeps the result only if it succeeded (a label whose continuation fails is
    dropped)."""
    if episode.seed >= EVAL_SEED:
        raise ValueError(f"seed {episode.seed} is an evaluation seed (>= {EVAL_SEED}): never relabelled")
    branch = Branch([r.decision for r in episode.records[:at]], policy, teacher, teacher_calls=max_steps)
    result = run_branch(env, branch, episode, max_steps)
    return result if reproduced(branch, episode) else None
