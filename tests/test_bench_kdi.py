"""kafka-delta-ingest's mode of the pipeline bench, the parts that need no build of it: the steps it reads (JSON),
the table it appends to (created with the schema of that JSON), its command line, its process (core.processes.Child
running another program), and the refusal of a binary that is not one."""

from __future__ import annotations

import io
import os
import stat
import subprocess
import sys
import time

import msgspec
import pyarrow.json as pa_json
from deltalake import write_deltalake

from core.processes import Child
from flywheel.bench.kdi import create_table, json_step, kdi_command, kdi_schema
from flywheel.bench.synthetic import bench_step, render_screens
from lake.tables import open_table
from schemas import Action, Verify


def test_a_steps_json_fills_the_table_created_for_it_field_for_field(tmp_path):
    screens = render_screens(2)
    # a step with every optional field set (a teacher's label, a sampled policy's tokens)
    taught = msgspec.structs.replace(
        bench_step(screens, "c", 9, 0, 5),
        screenshot=b"\x89PNG",
        seed=7,
        tokens=(1, 2),
        token_logprobs=(-0.5, -0.1),
        target_box=(1.0, 2.0, 3.0, 4.0),
        teacher_action=Action("type", text="hi"),
        verify=Verify("c", "c", True),
    )
    steps = [bench_step(screens, "c", episode, 0, 5) for episode in range(3)] + [taught]
    lines = b"\n".join(json_step(step) for step in steps)
    schema = kdi_schema()
    # every field the JSON holds has its column, typed (an unknown field or a value of another type raises)
    rows = pa_json.read_json(io.BytesIO(lines), parse_options=pa_json.ParseOptions(
        explicit_schema=schema, unexpected_field_behavior="error"))  # fmt: skip
    table_path = tmp_path / "steps"
    create_table(table_path, schema)
    write_deltalake(str(table_path), rows, mode="append")
    read = open_table(str(table_path)).to_pyarrow_table().to_pylist()
    assert [r["event_id"] for r in read] == [s.event_id for s in steps]
    last = read[-1]
    assert (last["seed"], last["tokens"], last["target_box"]) == (7, [1, 2], [1.0, 2.0, 3.0, 4.0])
    assert last["teacher_action"]["text"] == "hi" and last["verify"]["ok"] is True
    assert last["screenshot"] == "iVBORw==" and read[0]["kind"] == "step"  # bytes as base64


def test_its_command_line_keeps_our_batch_rule(tmp_path):
    command = kdi_command("/opt/kdi", "p.steps", tmp_path / "steps", "127.0.0.1:9092", 2000)
    assert command[:5] == ["/opt/kdi", "ingest", "p.steps", str(tmp_path / "steps"), "--checkpoints"]
    flags = dict(zip(command[5::2], command[6::2], strict=True))
    settings = [value for flag, value in zip(command[5::2], command[6::2], strict=True) if flag == "-K"]
    assert settings == [f"max.partition.fetch.bytes={32 * 1024 * 1024}", "fetch.wait.max.ms=100"]  # our fetches
    assert flags["--max_messages_per_batch"] == "2000" and flags["--allowed_latency"] == "1"
    assert flags["--kafka"] == "127.0.0.1:9092" and flags["--auto_offset_reset"] == "earliest"


def test_the_process_wrapper_reports_stops_and_tails(tmp_path):
    script = tmp_path / "stand-in"
    script.write_text("#!/bin/sh\necho started\nexec sleep 60\n")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    process = Child("kafka-delta-ingest", [], tmp_path / "logs", program=[str(script)])
    deadline = time.monotonic() + 10
    while "started" not in process.tail() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert process.running() and "started" in process.tail()
    process.stop()
    assert not process.running()


def test_a_binary_that_is_not_one_is_refused_before_anything_starts(tmp_path):
    missing = tmp_path / "kafka-delta-ingest"
    result = subprocess.run([sys.executable, "-m", "flywheel.cli", "bench", "pipeline", "--out", str(tmp_path / "out"),
                             "--kdi-binary", str(missing)], capture_output=True, text=True,
                            env={**os.environ, "FLYWHEEL_HOME": str(tmp_path / "home")})  # fmt: skip
    assert result.returncode == 2, result.stderr[-2000:]
    assert str(missing) in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "out").exists() and not (tmp_path / "home").exists()
