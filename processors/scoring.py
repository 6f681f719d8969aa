"""Episode assembly and scoring as pure functions (the faust agents only route events).

What a scored episode becomes in training_samples: processors.curation."""

from __future__ import annotations

from dataclasses import dataclass, field

from schemas import EpisodeEvent, StepEvent, new_event_id


@dataclass(frozen=True)
class ScoreWeights:
    """score = completion_w * completion + efficiency_w * step_efficiency + verification_w * verification."""

    completion: float = 0.7
    step_efficiency: float = 0.15
    verification: float = 0.15


@dataclass
class EpisodeProgress:
    """What assembly remembers of an unfinished episode. Keyed by step index, so a redelivered step
    overwrites itself instead of counting twice. Small fields only, never a step: an open episode costs memory
    until it ends or is abandoned."""

    task: str = ""
    client_id: str = ""
    model_version: str = ""
    episode_id: str = ""
    seed: int | None = None
    first_produced_at: float = 0.0
    last_step: int = -1  # the furthest step seen, with its produced_at (an abandoned episode's) and env reward
    last_produced_at: float = 0.0
    last_reward: float = 0.0
    verified: dict[int, bool | None] = field(default_factory=dict)

    def add(self, step: StepEvent) -> None:
        self._record(step.episode_id, step.step, step.task, step.client_id, step.model_version, step.seed,
                     step.produced_at, step.reward, step.verify.ok)  # fmt: skip

    def add_row(self, row: dict) -> None:
        """Add a step given as its `steps` row (those columns at least: a step recovered from Delta)."""
        self._record(row["episode_id"], row["step"], row["task"], row["client_id"], row["model_version"], row["seed"],
                     row["produced_at"], row["reward"], row["verify_ok"])  # fmt: skip

    def _record(self, episode_id: str, step: int, task: str, client_id: str, model_version: str, seed: int | None,
                produced_at: float, reward: float, verify_ok: bool | None) -> None:  # fmt: skip
        if not self.verified:
            self.task, self.client_id, self.model_version = task, client_id, model_version
            self.episode_id, self.seed, self.first_produced_at = episode_id, seed, produced_at
        if step >= self.last_step:
            self.last_step, self.last_produced_at, self.last_reward = step, produced_at, reward
        self.verified[step] = verify_ok


def step_efficiency(steps: int, reference_steps: int = 1) -> float:
    """1.0 at or under the reference step count, decaying as 1/(1 + extra steps)."""
    return 1.0 / (1 + max(0, steps - reference_steps))


def verification_rate(verified: dict[int, bool | None]) -> float:
    """Fraction of checkable steps whose expectation held (1.0 when nothing was checkable)."""
    checked = [ok for ok in verified.values() if ok is not None]
    return sum(checked) / len(checked) if checked else 1.0


def score_episode(last: StepEvent, progress: EpisodeProgress, weights: ScoreWeights = ScoreWeights()) -> EpisodeEvent:
    """The scored EpisodeEvent for an episode whose final step is `last`.

    How it ended is the edge loop's verdict, carried on the final step (v1 steps get theirs from the
    upcaster); a final step that states none never claimed success, so it counts as a failure.
    """
    steps = last.step + 1
    termination = last.termination or "failure"
    success = termination == "success"
    completion = 1.0 if success else 0.0
    efficiency = step_efficiency(steps) if success else 0.0
    verification = verification_rate(progress.verified)
    return EpisodeEvent(
        event_id=new_event_id(),
        client_id=last.client_id,
        produced_at=last.produced_at,  # not the scoring time: a re-emission after a crash carries the same time
        episode_id=last.episode_id,
        task=last.task,
        seed=last.seed,
        steps=steps,
        raw_reward=last.reward,
        binary_reward=1.0 if success else -1.0,
        success=success,
        termination=termination,
        model_version=last.model_version,
        policy=policy_of(last.model_version),
        first_produced_at=progress.first_produced_at or last.produced_at,
        completion=completion,
        step_efficiency=efficiency,
        verification=verification,
        score=weights.completion * completion
        + weights.step_efficiency * efficiency
        + weights.verification * verification,
    )


def score_abandoned(progress: EpisodeProgress, weights: ScoreWeights = ScoreWeights()) -> EpisodeEvent:
    """The EpisodeEvent of an episode closed without its final step (processors.assembly: no step for the gap).

    Scored as a failure (no completion, no efficiency; its verification still counts), ended "abandoned", and
    never a success: whatever its last reward, the env did not end it while anyone was listening.
    """
    verification = verification_rate(progress.verified)
    return EpisodeEvent(
        event_id=new_event_id(),
        client_id=progress.client_id,
        produced_at=progress.last_produced_at,  # its newest step's, as a complete episode's is its final step's
        episode_id=progress.episode_id,
        task=progress.task,
        seed=progress.seed,
        steps=progress.last_step + 1,  # as far as it got: its steps are in `steps`
        raw_reward=progress.last_reward,
        binary_reward=-1.0,
        success=False,
        termination="abandoned",
        model_version=progress.model_version,
        policy=policy_of(progress.model_version),
        first_produced_at=progress.first_produced_at,
        verification=verification,
        score=weights.verification * verification,
    )


def policy_of(model_version: str) -> str:
    return "expert" if model_version == "expert" else "model"
