"""The teacher in the loop: it labels a screen the policy actually saw with what it would have done there.

Here the teacher is the stateless DOM expert (edge_client.experts); in a deployment it is a large remote model
or a person, so every call is a cost. A budget bounds the labels (per episode, and in any sliding hour), and a
rule says which states are worth one; the first reason that holds is recorded on the step:

    verify_failed   the previous step's verify check failed: the policy is somewhere it did not expect to be
    uncertain       the policy gave its own action a probability below `teacher_uncertain_below`
    failing_task    the episode's task is one this client has been failing: success over its last
                    `teacher_window` episodes below `teacher_failing_below` (or no episode of it yet)

A screen the teacher already labelled (the same task, instruction, step and pixels: a group's rollouts of one
seed share their first screens) gets that label again without a call. The label is read from the screen the
policy chose on, before its action runs: the episode loop reads the DOM
for the teacher only when a label is due (GuiEnv.read_dom), so a model's steps stay pixels-only otherwise.
The learner aggregates every (own state, teacher action) row, DAgger's data
(learner.data.tables.load_teacher_labels).
"""

from __future__ import annotations

import hashlib
import logging
import math
import time
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass

from edge_client import metrics
from policy.interface import Decision, Observation, Policy

log = logging.getLogger(__name__)

REASONS = ("verify_failed", "uncertain", "failing_task")


@dataclass(frozen=True)
class TeacherConfig:
    """Which states a client asks its teacher about, and how many calls it may spend."""

    teacher_budget: int = 0
    """Labels per episode at most (0: no teacher)."""
    teacher_per_hour: float = 0.0
    """Labels in any sliding hour at most, over the client's run (0: no hourly bound)."""
    teacher_ask: tuple[str, ...] = REASONS
    """The reasons a state is worth a label, among verify_failed, uncertain, failing_task."""
    teacher_uncertain_below: float = 0.5
    """uncertain: the policy's probability of the action it took is below this."""
    teacher_failing_below: float = 0.9
    """failing_task: the task's success over this client's last teacher_window episodes is below this."""
    teacher_window: int = 8
    """failing_task: how many recent episodes of a task count."""

    def __post_init__(self) -> None:
        unknown = set(self.teacher_ask) - set(REASONS)
        if unknown:
            raise ValueError(f"teacher_ask: unknown reasons {sorted(unknown)}; the reasons are {', '.join(REASONS)}")
        if self.teacher_budget < 0 or self.teacher_per_hour < 0:
            raise ValueError("teacher_budget and teacher_per_hour must be >= 0")

    @property
    def active(self) -> bool:
        return self.teacher_budget > 0


class Teacher:
    """Decides, per step, whether a label is due, and asks `label_for(task)` (a Policy that reads the DOM)."""

    def __init__(self, config: TeacherConfig, label_for: Callable[[str], Policy],
                 clock: Callable[[], float] = time.monotonic):  # fmt: skip
        self.config, self.label_for, self.clock = config, label_for, clock
        self.labels: Counter[str] = Counter()  # labels given, by reason
        self.skipped: Counter[str] = Counter()  # due but not asked, by why: budget_episode, budget_hour, no_label
        self._recent: dict[str, deque[bool]] = {}  # per task: its last episodes' success
        self._asked_at: deque[float] = deque()  # times of the labels of the last hour
        self._in_episode = 0
        self._failing = False
        self._known: dict[bytes, Decision] = {}  # labels by state (known_state), reused without a call
        self.reused = 0  # labels given again from _known

    def begin_episode(self, task: str) -> None:
        self._in_episode = 0
        recent = self._recent.get(task)
        rate = sum(recent) / len(recent) if recent else 0.0
        self._failing = rate < self.config.teacher_failing_below

    def end_episode(self, task: str, success: bool) -> None:
        self._recent.setdefault(task, deque(maxlen=self.config.teacher_window)).append(success)

    def reason(self, decision: Decision, previous_ok: bool | None) -> str | None:
        """Why the state `decision` was taken on is worth a label (None: by the rule, it is not)."""
        ask = self.config.teacher_ask
        if "verify_failed" in ask and previous_ok is False:
            return "verify_failed"
        if "uncertain" in ask and decision.logprob is not None and \
                math.exp(decision.logprob) < self.config.teacher_uncertain_below:  # fmt: skip
            return "uncertain"
        if "failing_task" in ask and self._failing:
            return "failing_task"
        return None

    def affordable(self) -> bool:
        """Whether the budget allows one more call now (a call it refuses is counted as skipped)."""
        if self._in_episode >= self.config.teacher_budget:
            return self._skip("budget_episode")
        now = self.clock()
        while self._asked_at and now - self._asked_at[0] >= 3600.0:
            self._asked_at.popleft()
        if self.config.teacher_per_hour and len(self._asked_at) >= self.config.teacher_per_hour:
            return self._skip("budget_hour")
        return True

    def known(self, obs: Observation) -> Decision | None:
        """The label of a screen already labelled (no call), else None."""
        return self._known.get(known_state(obs))

    def label(self, obs: Observation, why: str) -> Decision | None:
        """The teacher's decision on `obs` (which must carry the DOM); None when it could not give one. A call made
        is a call spent, answered or not."""
        self._in_episode += 1
        self._asked_at.append(self.clock())
        started = time.perf_counter()
        try:
            decision = self.label_for(obs.task).act(obs)
        except (LookupError, ValueError) as err:  # the teacher could not read this screen (an expert's LookupError)
            log.info("teacher gave no label on %s step %d: %s", obs.task, obs.step, err)
            self._skip("no_label")
            return None
        finally:
            metrics.TEACHER_SECONDS.observe(time.perf_counter() - started)
        self.labels[why] += 1
        metrics.TEACHER_LABELS.labels(why).inc()
        self._known[known_state(obs)] = decision
        return decision

    def reuse(self, decision: Decision) -> Decision:
        self.reused += 1
        metrics.TEACHER_REUSED.inc()
        return decision

    def _skip(self, why: str) -> bool:
        self.skipped[why] += 1
        metrics.TEACHER_SKIPPED.labels(why).inc()
        return False


def known_state(obs: Observation) -> bytes:
    """What makes two screens one state to a stateless teacher: task, instruction, step and pixels."""
    digest = hashlib.blake2b(obs.screenshot.tobytes(), digest_size=16)
    digest.update(f"{obs.task}\x00{obs.instruction}\x00{obs.step}".encode())
    return digest.digest()
