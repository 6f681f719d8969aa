import polars as pl
import pyarrow as pa
from deltalake import write_deltalake

from lake.tables import PARTITION_BY, STEPS, STEPS_SCHEMA, table_uri
from processors.assembly import EpisodeAssembler
from processors.delta_sink import DeltaSink, Record
from processors.rows import step_row
from schemas import StepEvent, Verify, decode_event
from tests.factories import step_event, v1_step_bytes

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


def test_step_rows_carry_the_ending_and_merge_into_a_table_written_before_it(tmp_path):
    """A `steps` table from before schema v2 lacks the termination and seed columns: the sink merges them in."""
    old_schema = pa.schema([f for f in STEPS_SCHEMA if f.name not in ("termination", "seed")])
    first, second, last = steps_of_one_episode()
    old_row = {k: v for k, v in step_row(first, 0, 0).items() if k in old_schema.names}
    write_deltalake(
        table_uri(tmp_path, STEPS), pa.Table.from_pylist([old_row], schema=old_schema), partition_by=PARTITION_BY[STEPS]
    )

    DeltaSink(tmp_path, STEPS).write([Record("t", 0, i, [step_row(s, 0, i)]) for i, s in ((1, second), (2, last))])
    rows = pl.read_delta(table_uri(tmp_path, STEPS)).sort("step").select("step", "termination", "seed").rows()
    assert rows == [(0, None, None), (1, None, 7), (2, "success", 7)]


def test_an_episode_of_v1_steps_is_assembled_as_before(tmp_path):
    v1 = [decode_event(v1_step_bytes(s), expect=StepEvent) for s in steps_of_one_episode()]
    (episode,) = EpisodeAssembler(tmp_path).observe(v1)
    assert episode.success and episode.termination == "success" and episode.seed == 3 and episode.steps == 3
