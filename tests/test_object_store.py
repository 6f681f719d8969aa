"""The tables and the model store on a real S3-compatible server (S3Proxy 4.x, started by the project): conditional
puts that let exactly one writer win, two processes committing to one Delta table without losing a commit, polars
reading through the table URI, signed requests, and the model store's objects verified by digest. Every request
goes through obstore (core.object_store.Files) or delta-rs to the real server: nothing is mocked."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from core.object_store import Files, ObjectStoreError, PreconditionFailed, S3Config, TooLarge, join, split_uri
from core.settings import Settings
from lake import s3proxy
from lake.pins import live_pins, pinned
from lake.queries import step_count
from lake.tables import STEPS, open_table, scan, table_exists, table_uri
from processors.delta_sink import DeltaSink, Record
from processors.table_rows import step_row
from registry.store import (
    ModelRejected,
    artifact_location,
    fetch_verified,
    read_manifests,
    resolve_model,
    sha256_of,
    store_artifact,
    write_manifest,
)
from schemas import ModelVersionEvent, new_event_id
from tests.conftest import free_port, link_shared_s3proxy
from tests.factories import step_event


def test_of_32_parallel_conditional_puts_to_one_key_exactly_one_succeeds(s3_settings: Settings):
    key = str(join(s3_settings.data_dir, "race", "commit.json"))
    barrier, outcomes, files = threading.Barrier(32), {}, s3_settings.files()

    def put(writer: int) -> None:
        barrier.wait()  # obstore releases the GIL for the request, and its pool opens a connection for each in flight
        try:
            files.write(key, f"writer {writer}".encode(), if_absent=True)
            outcomes[writer] = "won"
        except PreconditionFailed:
            outcomes[writer] = "412"

    threads = [threading.Thread(target=put, args=(w,)) for w in range(32)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    winners = [w for w, outcome in outcomes.items() if outcome == "won"]
    assert len(outcomes) == 32 and len(winners) == 1, outcomes
    assert s3_settings.files().read(key) == f"writer {winners[0]}".encode()  # the winner's bytes, never replaced


def test_the_probe_passes_here_and_requests_are_signed(s3_settings: Settings):
    s3proxy.probe_conditional_put(s3_settings.s3_config)  # raises on a store that would overwrite
    wrong = S3Config(s3_settings.s3_config.endpoint, s3_settings.s3_config.access_key, "not-the-secret")
    with pytest.raises(ObjectStoreError, match="403"):
        Files(lambda: wrong).read(str(join(s3_settings.data_dir, "anything")))
    assert s3proxy.status(s3_settings)["running"]


def test_an_s3proxy_that_ignores_if_none_match_is_refused(tmp_path):
    """S3Proxy 2.6.0 (Maven Central) overwrites on a second If-None-Match: * PUT: `up` refuses it, naming why, and
    stops what it started."""
    settings = Settings(home=tmp_path / "home", s3_port=free_port(), s3proxy_version="2.6.0", s3_endpoint="",
                        s3_access_key="", s3_secret_key="")  # its own, not the session's store  # fmt: skip
    link_shared_s3proxy(settings)
    try:
        with pytest.raises(ObjectStoreError, match="If-None-Match"):
            s3proxy.up(settings)
        assert not s3proxy.status(settings)["running"]
    finally:
        s3proxy.down(settings)  # whatever happened above, no server outlives the test


APPENDER = """
import sys
import pyarrow as pa
from deltalake import write_deltalake
from lake.tables import storage_options
uri, writer, m = sys.argv[1], sys.argv[2], int(sys.argv[3])
for i in range(m):
    rows = pa.table({"writer": [writer], "i": [i]})
    write_deltalake(uri, rows, mode="append", storage_options=storage_options(uri))
"""


def test_two_processes_appending_to_one_table_lose_no_commit(s3_settings: Settings):
    import pyarrow as pa
    from deltalake import write_deltalake

    from lake.tables import storage_options

    uri, m = table_uri(s3_settings.tables_dir, "race"), 15
    write_deltalake(uri, pa.table({"writer": ["init"], "i": [0]}), storage_options=storage_options(uri))  # v0
    writers = [subprocess.Popen([sys.executable, "-c", APPENDER, uri, name, str(m)]) for name in ("a", "b")]
    assert [w.wait(timeout=300) for w in writers] == [0, 0]
    table = open_table(uri)
    assert table.version() == 2 * m  # every commit is a version: 1 + 2M commits, none overwritten
    rows = scan(uri).collect()
    assert rows.height == 1 + 2 * m
    for name in ("a", "b"):
        assert sorted(rows.filter(rows["writer"] == name)["i"].to_list()) == list(range(m))


def test_the_sinks_write_and_polars_reads_through_the_table_uri(s3_settings: Settings):
    tables = s3_settings.tables_dir
    uri = table_uri(tables, STEPS)
    assert uri.startswith("s3://") and not table_exists(uri)
    assert step_count(tables) == 0
    sink = DeltaSink(tables, STEPS)
    events = [step_event(f"c0-click-test-{i}-0") for i in range(6)]
    assert sink.write([Record("t.steps", 0, i, [step_row(e, 0, i)]) for i, e in enumerate(events)]) == 6
    # a redelivery of what is in: nothing written twice (the sink reads its offsets back from the table on S3)
    again = DeltaSink(tables, STEPS)
    assert again.write([Record("t.steps", 0, i, [step_row(e, 0, i)]) for i, e in enumerate(events)]) == 0
    assert table_exists(uri) and step_count(tables) == 6
    assert sorted(scan(uri).collect()["event_id"].to_list()) == sorted(e.event_id for e in events)
    bucket, key = split_uri(uri)
    assert bucket == "flywheel-test" and key.endswith("/tables/steps")


def test_the_model_store_on_s3_is_content_addressed_and_verified(s3_settings: Settings, tmp_path: Path):
    artifacts = s3_settings.artifacts_dir
    model = tmp_path / "model.vla"
    model.write_bytes(b"weights" * 1000)
    uri, digest = store_artifact(model, artifacts)
    assert uri == f"{artifacts}/sha256/{digest}.vla"
    assert store_artifact(model, artifacts) == (uri, digest)  # a second store of the same bytes: the same object
    event = ModelVersionEvent(event_id=new_event_id(), produced_at=1.0, version="sft-0001", parent="", stage="sft",
                              artifact_uri=uri, sha256=digest, channel="stable", lineage={STEPS: 3})  # fmt: skip
    write_manifest(event, artifacts, {"checkpoint": ""})
    assert [m["version"] for m in read_manifests(artifacts)] == ["sft-0001"]
    path, version = resolve_model("latest", artifacts)
    assert version == "sft-0001" and path.read_bytes() == model.read_bytes()  # fetched into the local cache

    # An object whose bytes are not its name's digest (tampered with, or half-written by a broken client).
    honest = tmp_path / "other.vla"
    honest.write_bytes(b"other weights")
    other_digest = sha256_of(honest)
    tampered = f"{artifacts}/sha256/{other_digest}.vla"
    s3_settings.files().write(tampered, b"not the weights")
    for _ in range(2):  # refused each time: never cached
        with pytest.raises(ModelRejected, match="checksum mismatch"):
            fetch_verified(tampered, other_digest)
    with pytest.raises(ModelRejected, match="does not exist") as missing:
        fetch_verified(str(join(artifacts, "sha256", "1" * 64 + ".vla")), "1" * 64)
    assert not missing.value.permanent  # it may still appear: the edge retries later


@pytest.mark.parametrize("store", ["local", "s3"])
def test_a_manifests_artifact_uri_is_a_location_files_can_rewrite(store, s3_settings: Settings, tmp_path: Path):
    """What the chaos run's corrupt_artifact strike does: read the artifact a manifest names, flip a byte, write it
    back; the digest check refuses it. A local store names its artifacts by file:// URI, which Files does not take."""
    settings = s3_settings if store == "s3" else s3_settings.model_copy(update={"data_dir": tmp_path / "data"})
    model = tmp_path / "model.vla"
    model.write_bytes(os.urandom(7000))  # bytes of its own: an s3 artifact verified once is kept in the local cache
    uri, digest = store_artifact(model, settings.artifacts_dir)
    assert uri.startswith("s3://" if store == "s3" else "file://")
    location, files = artifact_location(uri), settings.files()
    good = files.read(location)
    assert good == model.read_bytes()
    files.write(location, good[:100] + bytes([good[100] ^ 0xFF]) + good[101:])
    with pytest.raises(ModelRejected, match="checksum mismatch"):
        fetch_verified(uri, digest)
    files.write(location, good)  # repaired
    assert fetch_verified(uri, digest).read_bytes() == good
    with pytest.raises(ModelRejected, match="unsupported artifact scheme 'http'"):
        artifact_location("http://example.org/model.vla")


def test_a_pin_on_the_object_store_is_a_lease(s3_settings: Settings):
    pins = s3_settings.pins_dir
    with pinned(pins, {STEPS: 7}) as location:
        assert str(location).startswith(f"{pins}/") and live_pins(pins) == [{STEPS: 7}]
    assert live_pins(pins) == []  # removed on exit
    with pinned(pins, {STEPS: 3}, lease_s=-1.0):  # a reader that crashed a lease ago: its pin no longer holds
        assert live_pins(pins) == []


@pytest.mark.parametrize("store", ["local", "s3"])
def test_files_behave_alike_on_a_local_disk_and_the_object_store(store, s3_settings: Settings, tmp_path: Path):
    """The contract every caller relies on, the same cases on each backend."""
    root = s3_settings.data_dir if store == "s3" else tmp_path / "data [x]"  # a local name obstore must not mangle
    files, a, b = s3_settings.files(), join(root, "d", "a.json"), join(root, "d", "sub", "b.json")
    assert files.read(a) is None and not files.exists(a) and files.list(join(root, "d")) == []
    files.delete(a)  # nothing there: nothing to do
    files.write(a, b"1")
    files.write(a, b"2")  # a plain write replaces
    files.write(b, b"3" * 10, if_absent=True)
    files.write(join(root, "dd", "c.json"), b"4")  # a sibling whose name starts alike is not under d/
    with pytest.raises(PreconditionFailed):
        files.write(b, b"other", if_absent=True)
    assert files.read(a) == b"2" and files.read(b) == b"3" * 10 and files.exists(b)
    assert files.list(join(root, "d")) == [a, b]
    with pytest.raises(TooLarge):
        files.read(b, max_bytes=9)
    assert files.read(b, max_bytes=10) == b"3" * 10
    files.delete(a)
    assert files.list(join(root, "d")) == [b] and files.read(a) is None
