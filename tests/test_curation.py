"""Curation judges each episode on its task's history before it: the bar rises as the model improves."""

from __future__ import annotations

from types import SimpleNamespace

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


def test_the_history_kept_between_batches_judges_as_the_whole_table_does(tmp_path):
    """CurationHistory keeps each partition's memory between batches and reads the table only when it may be stale:
    first use, a redelivered batch, a commit that was not ours. Its decisions equal the reference's (curate_batch on
    every row of the table) at every batch."""
    import polars as pl

    from lake.tables import EPISODES, table_uri
    from processors.curation import HISTORY_COLUMNS, CurationHistory
    from processors.delta_sink import DeltaSink
    from processors.messages import episode_records
    from schemas import encode_event

    sink = DeltaSink(tmp_path, EPISODES)
    history = CurationHistory(sink)
    reads = []
    read = history._rows
    history._rows = lambda partition: reads.append(partition) or read(partition)
    next_offset = {0: 0, 1: 0}

    def messages(count: int, first_seed: int, succeeding: bool = False) -> list:
        found = []
        for i in range(count):
            partition, seed = i % 2, first_seed + i
            ep = episode(task=("click-test", "click-button")[partition], seed=seed, success=succeeding or seed % 3 != 0)
            found.append(SimpleNamespace(topic="t.episodes", partition=partition, offset=next_offset[partition],
                                         value=encode_event(ep), episode=ep))  # fmt: skip
            next_offset[partition] += 1
        return found

    def table_rows() -> list[dict]:
        uri = table_uri(tmp_path, EPISODES)
        return pl.read_delta(uri).select(HISTORY_COLUMNS).to_dicts() if (tmp_path / EPISODES).exists() else []

    weights = set()

    def judged_alike(batch_messages: list) -> None:
        batch = [(m.partition, m.offset, m.episode) for m in batch_messages]
        reference = curate_batch(batch, table_rows())
        assert history.curate(batch) == reference
        weights.update(d.weight for d in reference)

    for b in range(6):  # the bar rises as the model's successes pile up: the later batches see solved tasks
        batch_messages = messages(24, first_seed=100 * b, succeeding=b >= 2)
        judged_alike(batch_messages)
        sink.write(episode_records(batch_messages)[0])
        history.committed()
    assert reads == [0, 1, 0, 1]  # first use, and after the commit that created the table
    judged_alike(batch_messages)  # redelivered: its rows are in the table already
    assert reads[-2:] == [0, 1]
    sink.write(episode_records(batch_messages)[0])  # nothing new
    history.committed()
    theirs = messages(4, first_seed=1000)
    DeltaSink(tmp_path, EPISODES, sink="theirs").write(episode_records(theirs)[0])  # a commit not ours
    judged_alike(messages(6, first_seed=2000))
    assert reads[-2:] == [0, 1] and len(reads) == 8
    fresh = messages(6, first_seed=3000)
    judged_alike(fresh + fresh[2:])  # offsets repeated within a batch (a rebalance before the ack): the last copy
    sink.write(episode_records(fresh)[0])
    history.committed()
    junk = [SimpleNamespace(topic="t.episodes", partition=0, offset=next_offset[0], value=b"junk")]
    next_offset[0] += 1
    sink.write(episode_records(junk, history.curate)[0])  # a batch of dead letters alone
    history.committed()  # it used to add 1 to the version of a batch never judged
    reads_before, last = len(reads), messages(4, first_seed=4000)
    judged_alike(last + last[:2])  # repeated offsets on memories kept: the last copy, and no read
    assert len(reads) == reads_before
    assert {2.0, 1.0, 0.5, 0.1} <= weights  # not measured yet, measured, failures, solved: the history mattered
