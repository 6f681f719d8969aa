"""Curation judges each episode on its task's history before it: the bar rises as the model improves."""

from __future__ import annotations

from processors.curation import MIN_EPISODES, curate_batch
from processors.scoring import EpisodeProgress, score_abandoned, score_episode
from schemas import Verify
from tests.factories import step_event


def episode(task="click-test", seed=7, success=True, version="v1", steps=1, verified=True, termination=None):
    progress = EpisodeProgress()
    for i in range(steps - 1):
        progress.add(step_event(step=i, done=False, verify=Verify("x", "y", verified)))
    last = step_event(f"c0-{task}-{seed}-0", step=steps - 1, reward=1.0 if success else -1.0, model_version=version,
                      seed=seed, termination=termination or ("success" if success else "failure"))  # fmt: skip
    progress.add(last)
    return score_episode(last, progress)


def history_row(offset, task="click-test", seed=None, success=True, policy="model", partition=0):
    return {"episode_id": f"h{partition}-{offset}", "task": task, "seed": seed if seed is not None else 1000 + offset,
            "success": success, "policy": policy, "termination": "success" if success else "failure",
            "kafka_partition": partition, "kafka_offset": offset}  # fmt: skip


def judge(ep, history, offset=10_000):
    return curate_batch([(0, offset, ep)], history)[0]


def test_demonstrations_are_kept_failed_ones_and_broken_browsers_dropped():
    assert judge(episode(version="expert"), []).purpose == "demo"
    assert judge(episode(version="expert"), []).weight == 1.0
    assert judge(episode(version="expert", success=False), []) is None
    assert judge(episode(termination="error", success=False), []) is None


def test_successes_on_a_solved_task_are_down_weighted_and_hard_ones_up_weighted():
    solved = [history_row(i) for i in range(50)]  # the model solved its last 50 episodes here
    hard = [history_row(i, success=i % 5 == 0) for i in range(50)]  # 20 %
    assert judge(episode(), solved).weight == 0.1 and "solved" in judge(episode(), solved).reason
    assert judge(episode(version="expert"), solved).weight == 0.2
    assert (judge(episode(), hard).weight, judge(episode(), hard).reason) == (2.0, "hard success")
    # too few episodes to measure: not down-weighted
    assert judge(episode(), solved[: MIN_EPISODES - 1]).weight == 2.0


def test_informative_failures_are_kept_with_more_weight():
    diverged = judge(episode(success=False, seed=7), [history_row(0, seed=7, success=True)])
    assert (diverged.purpose, diverged.weight) == ("failure", 2.0) and "same seed" in diverged.reason
    near = judge(episode(success=False, steps=3, verified=True), [])
    assert (near.weight, near.reason) == (1.5, "near miss")
    plain = judge(episode(success=False, steps=3, verified=False), [])
    assert (plain.weight, plain.reason) == (0.5, "failure")


def test_only_the_history_before_an_episode_grades_it():
    # The table already holds this batch (a redelivery) and later episodes: neither grades it.
    later = [history_row(i, success=True) for i in range(100, 160)]
    assert judge(episode(), later, offset=50).weight == 2.0  # not measured before offset 50
    # Within a batch, earlier episodes grade later ones: the 51st success after 50 is on a solved task.
    batch = [(0, i, episode(seed=100 + i)) for i in range(51)]
    decisions = curate_batch(batch, [])
    assert decisions[0].weight == 2.0 and decisions[-1].weight == 0.1
    # The same batch redelivered with its rows already in the table decides alike.
    rows = [history_row(i, seed=100 + i) | {"episode_id": e.episode_id} for i, (_, _, e) in enumerate(batch)]
    assert [d.weight for d in curate_batch(batch, rows)] == [d.weight for d in decisions]


def test_partitions_keep_their_own_history():
    other_partition = [history_row(i, partition=1) for i in range(50)]
    assert judge(episode(), other_partition).weight == 2.0


def test_abandoned_episodes_are_not_curated_and_not_held_against_the_model():
    """Closed without a final step (its client went quiet): it says nothing about the policy, like a browser error."""
    progress = EpisodeProgress()
    progress.add(step_event("c0-click-test-7-0", step=0, done=False, reward=1.0, model_version="v1"))
    abandoned = score_abandoned(progress)
    assert abandoned.termination == "abandoned" and not abandoned.success and abandoned.policy == "model"
    solved = [history_row(i) for i in range(50)]
    assert judge(abandoned, solved) is None and judge(abandoned, []) is None
    # 50 successes, then 50 abandoned episodes of the same model: the task is still solved, not suddenly hard.
    gone = [history_row(50 + i, success=False) | {"termination": "abandoned"} for i in range(50)]
    assert judge(episode(), solved + gone).weight == 0.1
