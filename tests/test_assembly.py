import asyncio
from types import SimpleNamespace

import polars as pl
import pyarrow as pa
from deltalake import write_deltalake
from prometheus_client import REGISTRY

from lake.tables import EPISODES, PARTITION_BY, STEPS, STEPS_SCHEMA, table_uri
from processors.assembly import EpisodeAssembler
from processors.delta_sink import DeltaSink, Record
from processors.messages import episode_records
from processors.metrics import count_episode
from processors.table_rows import episode_row, step_row
from processors.worker_config import WorkerConfig
from schemas import StepEvent, Verify, decode_event, encode_event
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


# --- every episode ends: abandoned by event time ------------------------------------------------------------------

T0 = 1_700_000_000.0  # event time; the assembler's wall clock is far later (a backlog read long after)
GAP = 300.0


def at(seconds: float, episode_id: str = EPISODE, step: int = 0, done: bool = False, **fields) -> StepEvent:
    """A step produced `seconds` of event time after T0."""
    reward = fields.pop("reward", 1.0 if done else 0.0)
    return step_event(episode_id, step=step, done=done, reward=reward, produced_at=T0 + seconds, **fields)


def assembler_at(tmp_path, now: float = T0 + 86_400, **kwargs) -> EpisodeAssembler:
    return EpisodeAssembler(tmp_path, abandon_after_s=GAP, clock=lambda: now, **kwargs)


def test_an_episode_without_a_step_for_the_gap_of_event_time_is_closed_as_abandoned(tmp_path):
    assembler = assembler_at(tmp_path)
    quiet = [at(0, step=0, verify=Verify("x", "changed", True)), at(10, step=1, verify=Verify("x", "same", False))]
    assert assembler.observe(quiet) == []  # a day of wall clock has passed, but no event time: nothing closes
    assert assembler.observe([at(GAP + 10, "c1-click-test-8-0")]) == []  # exactly the gap since its last step
    (abandoned,) = assembler.observe([at(GAP + 10.5, "c1-click-test-8-0", step=1)])
    assert (abandoned.episode_id, abandoned.termination, abandoned.success) == (EPISODE, "abandoned", False)
    assert (abandoned.steps, abandoned.binary_reward, abandoned.completion) == (2, -1.0, 0.0)
    assert abandoned.produced_at == T0 + 10 and abandoned.first_produced_at == T0  # its last step's, like a final one
    assert abandoned.verification == 0.5 and abandoned.score == 0.15 * 0.5
    assert (abandoned.seed, abandoned.task, abandoned.policy) == (7, "click-test", "expert")
    assert EPISODE not in assembler.open and "c1-click-test-8-0" in assembler.open


def test_event_time_is_kept_per_partition(tmp_path):
    assembler = assembler_at(tmp_path)
    assembler.observe([at(0)], partition=0)
    assert assembler.observe([at(GAP * 10, "c1-click-test-8-0")], partition=1) == []  # another partition's time
    (abandoned,) = assembler.observe([at(GAP + 1, "c2-click-test-9-0")], partition=0)
    assert abandoned.episode_id == EPISODE


def test_a_batch_is_assembled_per_partition_in_each_partitions_order(tmp_path):
    assembler = assembler_at(tmp_path)
    batch = {("steps", 0, 0): at(0), ("steps", 1, 0): at(GAP * 10, "c1-click-test-8-0"),
             ("steps", 0, 1): at(5, step=1, done=True)}  # fmt: skip
    (episode,) = assembler.observe_batch(batch)
    assert (episode.episode_id, episode.termination, episode.steps) == (EPISODE, "success", 2)


def test_a_client_clock_ahead_cannot_abandon_the_others_and_one_behind_is_not_abandoned(tmp_path):
    assembler = assembler_at(tmp_path, now=T0 + 100)
    assembler.observe([at(0)])
    assert assembler.observe([at(GAP * 100, "c1-click-test-8-0")]) == []  # in the future: event time stops at now
    behind = [at(60 * i - 3600, "c2-click-test-9-0", step=i) for i in range(20)]  # an hour behind, a step a minute
    others = [at(60 * i, f"c3-click-test-{i}-0") for i in range(20)]
    steps = [s for pair in zip(others, behind, strict=True) for s in pair]  # the others' first step starts the clock
    assembler = assembler_at(tmp_path)
    closed = assembler.observe(steps)
    assert "c2-click-test-9-0" not in {e.episode_id for e in closed} and "c2-click-test-9-0" in assembler.open


def test_a_late_step_lands_counted_and_neither_reopens_nor_emits_the_episode_again(tmp_path):
    late: list[int] = []
    assembler = assembler_at(tmp_path, on_late=late.append)
    emitted = assembler.observe([at(0), at(GAP + 1, "c1-click-test-8-0")])
    final = at(GAP + 2, step=1, done=True)  # the client was only cut off: its final step comes after the close
    emitted += assembler.observe([final, at(GAP + 3, step=1)])  # ... and a copy of a step with a new event_id
    emitted += assembler.observe([at(GAP * 5, "c1-click-test-8-0", step=1, done=True)])
    ended = [(e.episode_id, e.termination) for e in emitted]
    assert ended == [(EPISODE, "abandoned"), ("c1-click-test-8-0", "success")]
    assert sum(late) == 2 and EPISODE not in assembler.open
    assert assembler.observe([at(GAP * 20)]) == []  # nor does time moving on close it twice


def test_an_abandoned_episode_recalls_its_steps_committed_before_a_restart(tmp_path):
    first, second = at(0, step=0, verify=Verify("x", "changed", True)), at(10, step=1, verify=Verify("x", "y", False))
    DeltaSink(tmp_path, STEPS).write([Record("t", 0, 0, [step_row(first, 0, 0)])])
    restarted = assembler_at(tmp_path)  # saw only the second step
    (abandoned,) = restarted.observe([second, at(GAP + 11, "c1-click-test-8-0")])
    assert (abandoned.steps, abandoned.verification, abandoned.first_produced_at) == (2, 0.5, T0)


def test_after_a_restart_an_episode_already_in_the_table_is_not_emitted_again(tmp_path):
    """A restart forgets what was closed: the `episodes` table remembers it."""
    (abandoned,) = assembler_at(tmp_path).observe([at(0), at(GAP + 1, "c1-click-test-8-0")])
    DeltaSink(tmp_path, STEPS).write([Record("steps", 0, 0, [step_row(at(0), 0, 0)])])
    DeltaSink(tmp_path, EPISODES).write([Record("episodes", 0, 0, [episode_row(abandoned, 0, 0)])])
    late: list[int] = []
    restarted = assembler_at(tmp_path, on_late=late.append)
    assert restarted.observe([at(GAP + 2, step=1), at(GAP + 3, step=2, done=True)]) == []  # its end: late
    assert restarted.observe([at(GAP + 4, step=3)]) == []  # dropped at once now
    assert restarted.observe([at(GAP * 3, "c1-click-test-8-0", step=1)]) == []  # nor is it abandoned again
    assert sum(late) == 3 and EPISODE not in restarted.open
    # Steps of an abandoned episode seen only after a restart, the last of them before another gap: not twice either.
    restarted = assembler_at(tmp_path, on_late=late.append)
    assert restarted.observe([at(GAP + 2, step=1), at(GAP * 3, "c1-click-test-8-0", step=1)]) == []
    assert sum(late) == 4


def test_partitions_lost_in_a_rebalance_are_forgotten(tmp_path):
    assembler = assembler_at(tmp_path)
    assembler.observe([at(0)], partition=0)
    assembler.observe([at(0, "c1-click-test-8-0")], partition=1)
    assembler.assign([1])  # partition 0 is another worker's now: it completes or abandons that episode
    assert assembler.observe([at(GAP + 1, "c2-click-test-9-0")], partition=0) == []  # were it ever to come back
    assert set(assembler.open) == {"c1-click-test-8-0", "c2-click-test-9-0"}


class WallClock:
    """A wall clock the test moves."""

    def __init__(self, now: float):
        self.now = now

    def __call__(self) -> float:
        return self.now


def test_a_partition_quiet_for_the_gap_of_wall_clock_closes_what_it_holds_open(tmp_path):
    wall = WallClock(T0 + 20)
    assembler = EpisodeAssembler(tmp_path, abandon_after_s=GAP, clock=wall)
    assembler.observe([at(0), at(10, "c1-click-test-8-0")], partition=0)
    assembler.observe([at(15, "c2-click-test-9-0")], partition=1)
    wall.now += GAP  # exactly the gap: not yet
    assert assembler.tick() == []
    assembler.observe([at(GAP + 19, "c2-click-test-9-0", step=1)], partition=1)  # partition 1 is heard from
    wall.now += 1
    closed = assembler.tick()  # the fleet stopped: no step will move partition 0's event time on again
    assert [e.episode_id for e in closed] == [EPISODE, "c1-click-test-8-0"]
    assert {e.termination for e in closed} == {"abandoned"}
    assert set(assembler.open) == {"c2-click-test-9-0"} and assembler.tick() == []
    late: list[int] = []
    assembler.on_late = late.append
    assert assembler.observe([at(GAP + 30, step=1, done=True)], partition=0) == [] and late == [1]  # its end: late


def write_steps(tmp_path, steps: list[tuple[int, StepEvent]]) -> None:
    """`steps` as (kafka partition, event) committed to Delta, as a worker before this one did."""
    DeltaSink(tmp_path, STEPS).write([Record("steps", p, i, [step_row(s, p, i)]) for i, (p, s) in enumerate(steps)])


def test_a_newly_held_partition_recovers_what_the_worker_before_left_open(tmp_path):
    """The worker that held partition 0 died after committing these steps; their clients died too: no step comes."""
    gone, finished, closed, elsewhere = EPISODE, "c1-click-test-8-0", "c2-click-test-9-0", "c3-click-test-4-0"
    write_steps(tmp_path, [
        (0, at(0, gone, step=0, verify=Verify("x", "changed", True))),
        (0, at(5, gone, step=1, verify=Verify("x", "y", False))),
        (0, at(1, finished)), (0, at(2, finished, step=1, done=True)),
        (0, at(3, closed)), (1, at(4, elsewhere)),
    ])  # fmt: skip
    DeltaSink(tmp_path, EPISODES).write([Record("episodes", 0, 0, [episode_row(
        assembler_at(tmp_path).observe([at(3, closed), at(GAP + 4, "c9-click-test-1-0")])[0], 0, 0)])])  # fmt: skip
    wall = WallClock(T0 + 60)
    assembler = EpisodeAssembler(tmp_path, abandon_after_s=GAP, clock=wall)
    assembler.assign([0])
    assert assembler.tick() == [] and set(assembler.open) == {gone}  # not the finished, the closed, nor partition 1's
    wall.now += GAP + 1
    (abandoned,) = assembler.tick()
    assert (abandoned.episode_id, abandoned.termination, abandoned.steps) == (gone, "abandoned", 2)
    assert (abandoned.verification, abandoned.first_produced_at, abandoned.produced_at) == (0.5, T0, T0 + 5)
    assert assembler.open == {}


def test_a_recovered_episode_that_goes_on_completes_once(tmp_path):
    write_steps(tmp_path, [(0, at(0, step=0, verify=Verify("x", "changed", True)))])
    assembler = EpisodeAssembler(tmp_path, abandon_after_s=GAP, clock=WallClock(T0 + 60))
    assembler.assign([0, 1])
    (episode,) = assembler.observe([at(10, step=1, done=True)], partition=0)
    assert (episode.episode_id, episode.termination, episode.steps) == (EPISODE, "success", 2)
    assert assembler.open == {} and assembler.tick() == []


def test_an_abandoned_episode_is_never_curated_nor_counted_a_success(tmp_path):
    assembler = assembler_at(tmp_path)
    # It even saw a positive reward before it went quiet: still no success.
    (abandoned,) = assembler.observe([at(0, reward=1.0), at(GAP + 1, "c1-click-test-8-0")])
    assert abandoned.termination == "abandoned" and not abandoned.success and abandoned.raw_reward == 1.0
    message = SimpleNamespace(topic="episodes", partition=0, offset=5, value=encode_event(abandoned))
    episodes, samples, dead = episode_records([message])
    assert dead == [] and samples[0].rows == []  # in `episodes`, nothing in `training_samples`
    DeltaSink(tmp_path, EPISODES).write(episodes)
    row = pl.read_delta(table_uri(tmp_path, EPISODES)).select("episode_id", "termination", "success").row(0)
    assert row == (EPISODE, "abandoned", False)

    before = REGISTRY.get_sample_value("flywheel_episodes_scored_total", outcome_labels("abandoned")) or 0.0
    count_episode(abandoned)
    assert REGISTRY.get_sample_value("flywheel_episodes_scored_total", outcome_labels("abandoned")) == before + 1
    assert REGISTRY.get_sample_value("flywheel_episodes_scored_total", outcome_labels("success")) == 0.0


def outcome_labels(outcome: str) -> dict[str, str]:
    return {"task": "click-test", "outcome": outcome, "model_version": "expert"}


def test_the_steps_stream_tells_assembly_its_partitions_reads_on_from_delta_and_writes_out_what_it_gives_up(tmp_path):
    from aiokafka import TopicPartition as TP

    from core.settings import Settings
    from lake.tables import STEPS
    from processors.batching import Batcher
    from processors.delta_sink import DeltaSink, Record
    from processors.steps_stream import StepsStream

    settings = Settings(home=tmp_path, data_dir=tmp_path / "data", bootstrap_servers="127.0.0.1:1", topic_prefix="p")
    DeltaSink(settings.tables_dir, STEPS).append([Record("p.steps", 2, 7, [])])  # partition 2 written to offset 7
    told, written, seeks, paused, resumed = [], [], {}, [], []

    async def write(records) -> None:
        written.append(list(records))

    async def run() -> None:
        batcher = Batcher(write, lambda error: None, max_size=10, max_age_s=60, acknowledge=lambda records: None)
        stream = StepsStream(settings, batcher, lambda partitions: told.append(sorted(partitions)))
        stream.consumer.seek = lambda tp, offset: seeks.__setitem__(tp.partition, offset)
        stream.consumer.pause = lambda *tps: paused.append(sorted(tp.partition for tp in tps))
        stream.consumer.resume = lambda *tps: resumed.append(sorted(tp.partition for tp in tps))
        await stream.on_partitions_assigned({TP("p.steps", 2), TP("p.steps", 0)})
        await batcher.extend(["a", "b"])
        assert written == []  # not due yet
        await stream.on_partitions_revoked({TP("p.steps", 2)})

    asyncio.run(run())
    assert told == [[0, 2]] and seeks == {0: 0, 2: 8}
    assert paused == resumed == [[0, 2]]  # nothing fetched from the log's start while the offsets were read
    assert written == [["a", "b"]]  # in the table before the partition moves


def test_the_worker_counts_late_steps_and_abandons_after_its_setting(tmp_path, monkeypatch):
    from core.settings import Settings
    from processors import worker

    built: list[EpisodeAssembler] = []

    def build(*args, **kwargs) -> EpisodeAssembler:
        built.append(EpisodeAssembler(*args, **kwargs))
        return built[-1]

    monkeypatch.setattr(worker, "EpisodeAssembler", build)
    settings = Settings(home=tmp_path, data_dir=tmp_path / "data", bootstrap_servers="127.0.0.1:1", topic_prefix="p")
    worker.build_app(settings, WorkerConfig(abandon_after_s=42))
    (assembler,) = built
    before = REGISTRY.get_sample_value("flywheel_processor_late_steps_total")
    assembler.on_late(2)
    assert REGISTRY.get_sample_value("flywheel_processor_late_steps_total") == before + 2
    assert assembler.abandon_after_s == 42
