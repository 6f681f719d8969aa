import pytest

from processors.scoring import EpisodeProgress, score_episode, step_efficiency, verification_rate
from schemas import StepEvent, Verify, decode_event
from tests.factories import step_event, v1_step_bytes


def scored(last: StepEvent):
    progress = EpisodeProgress()
    progress.add(last)
    return score_episode(last, progress)


def test_step_efficiency_decays_with_extra_steps():
    assert step_efficiency(1) == 1.0
    assert step_efficiency(3) == 1 / 3


def test_verification_ignores_uncheckable_steps():
    assert verification_rate({0: True, 1: False, 2: None}) == 0.5
    assert verification_rate({0: None}) == 1.0


def test_redelivered_step_does_not_count_twice():
    progress = EpisodeProgress()
    first = step_event(step=0, done=False, verify=Verify("x", "y", False))
    progress.add(first)
    progress.add(first)
    progress.add(step_event(step=1, done=True))
    assert progress.verified == {0: False, 1: True}


def test_successful_two_step_episode_is_scored():
    progress = EpisodeProgress()
    progress.add(step_event(step=0, done=False, verify=Verify("x", "y", False)))
    last = step_event(step=1, done=True, reward=0.8)
    progress.add(last)
    episode = score_episode(last, progress)
    assert episode.success and episode.binary_reward == 1.0 and episode.steps == 2
    assert episode.step_efficiency == 0.5 and episode.verification == 0.5
    assert abs(episode.score - (0.7 * 1 + 0.15 * 0.5 + 0.15 * 0.5)) < 1e-9
    assert episode.seed == 7 and episode.policy == "expert"


def test_failure_scores_no_completion():
    episode = scored(step_event(reward=-1.0))
    assert not episode.success and episode.binary_reward == -1.0 and episode.completion == 0.0


@pytest.mark.parametrize("termination", ["failure", "timeout", "max_steps", "gave_up", "error"])
def test_ending_and_seed_are_read_from_the_final_step(termination):
    episode = scored(step_event("c0-click-test-7-0", reward=-1.0, termination=termination, seed=123))
    assert episode.termination == termination and episode.seed == 123
    assert not episode.success and episode.binary_reward == -1.0 and episode.completion == 0.0


def test_only_a_successful_ending_is_a_success():
    # A positive reward does not make a success the loop did not declare (here: the step budget ran out first).
    assert not scored(step_event(reward=0.5, termination="max_steps")).success
    # A final step that states no ending never claimed success.
    episode = scored(step_event(reward=1.0, termination=None))
    assert episode.termination == "failure" and not episode.success


def test_v1_final_step_is_scored_as_the_v1_scorer_did():
    last = decode_event(v1_step_bytes(step_event("c3-click-test-41-2", reward=1.0, seed=None)), expect=StepEvent)
    episode = scored(last)
    assert episode.success and episode.termination == "success" and episode.seed == 41
