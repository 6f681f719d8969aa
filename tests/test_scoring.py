from processors.scoring import EpisodeProgress, curate, score_episode, step_efficiency, verification_rate
from schemas import Verify
from tests.factories import step_event


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
    last = step_event(reward=-1.0)
    progress = EpisodeProgress()
    progress.add(last)
    episode = score_episode(last, progress)
    assert not episode.success and episode.binary_reward == -1.0 and episode.completion == 0.0


def test_curation_keeps_demos_and_fleet_outcomes_drops_failed_demos():
    def scored(reward, version):
        last = step_event(reward=reward, model_version=version)
        progress = EpisodeProgress()
        progress.add(last)
        return score_episode(last, progress)

    assert curate(scored(1.0, "expert")) == ("demo", 1.0)
    assert curate(scored(-1.0, "expert")) is None
    assert curate(scored(1.0, "sft-0001"))[0] == "success"
    assert curate(scored(-1.0, "sft-0001"))[0] == "failure"
