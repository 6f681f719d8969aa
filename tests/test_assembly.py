from processors.assembly import EpisodeAssembler
from processors.delta_sink import DeltaSink, Record
from processors.rows import step_row
from processors.tables import STEPS
from schemas import Verify
from tests.factories import step_event

EPISODE = "c0-click-test-3-0"


def steps_of_one_episode():
    return [
        step_event(EPISODE, step=0, done=False, reward=0.0, verify=Verify("x", "no change", False)),
        step_event(EPISODE, step=1, done=False, reward=0.0, verify=Verify("x", "changed", True)),
        step_event(EPISODE, step=2, done=True, reward=1.0, verify=Verify("x", "changed", True)),
    ]


def test_episode_completes_within_and_across_batches(tmp_path):
    first, second, last = steps_of_one_episode()
    assembler = EpisodeAssembler(tmp_path)
    assert assembler.observe([first, second]) == []
    (episode,) = assembler.observe([last])
    assert episode.steps == 3 and episode.success and abs(episode.verification - 2 / 3) < 1e-9
    assert assembler.open == {}


def test_steps_committed_before_a_restart_are_recalled_from_delta(tmp_path):
    first, second, last = steps_of_one_episode()
    DeltaSink(tmp_path, STEPS).write([Record("t", 0, i, [step_row(s, 0, i)]) for i, s in enumerate([first, second])])
    restarted = EpisodeAssembler(tmp_path)  # memory empty: the earlier steps are only in Delta
    (episode,) = restarted.observe([last])
    assert episode.steps == 3 and abs(episode.verification - 2 / 3) < 1e-9
    assert episode.first_produced_at == first.produced_at


def test_abandoned_episodes_do_not_grow_memory_forever(tmp_path):
    assembler = EpisodeAssembler(tmp_path, max_open=2)
    assembler.observe([step_event(f"c0-click-test-{i}-{i}", step=0, done=False) for i in range(5)])
    assert list(assembler.open) == ["c0-click-test-3-3", "c0-click-test-4-4"]
