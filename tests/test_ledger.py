"""The chaos run's ledger check (flywheel.run.ledger) on real Delta tables and a real model store: it finds a lost
step, a duplicated one, a stray dead letter, a reused version id, a broken parent chain and a tampered artifact,
and passes a clean run."""

from __future__ import annotations

import time
from pathlib import Path
from urllib.parse import urlparse

import msgspec

from edge_client.spool import Spool
from flywheel.chaos.ledger import (
    check_dead_letters,
    check_episodes,
    check_learner_kills,
    check_spools,
    check_steps,
    check_versions,
    ledger_ok,
    open_episode,
    read_client_ledgers,
    read_unconfirmed,
)
from lake.tables import STEPS
from processors.delta_sink import Record
from processors.table_rows import step_row
from registry.signing import load_or_create_key, sign
from registry.store import store_artifact, write_manifest
from schemas import Action, ModelVersionEvent, new_event_id
from tests.factories import TablesLog, step_event

RELEASE = Path(__file__).resolve().parents[1] / "release" / "model-int8.vla"


def logged(tmp_path: Path, episodes: int = 3) -> tuple[TablesLog, dict[str, str]]:
    log = TablesLog(tmp_path / "tables")
    for n in range(episodes):
        log.episode(f"c0-ep-{n}", n, Action("click", 5.0, 5.0), True, "expert")
    ledger = tmp_path / "c0.ledger"
    ledger.write_text("".join(f"s-c0-ep-{n} c0-ep-{n}\n" for n in range(episodes)) + "s-c0-ep-cut")  # a cut line
    return log, read_client_ledgers([ledger])


def test_a_clean_run_passes_and_each_kind_of_loss_is_found(tmp_path):
    log, owed = logged(tmp_path)
    tables = tmp_path / "tables"
    assert len(owed) == 3  # the line cut mid-write is not owed
    steps, episodes = check_steps(tables, owed), check_episodes(tables, owed)
    assert (steps["missing"], steps["duplicated"], steps["unowed"], episodes["missing"]) == (0, 0, 0, 0)

    lost = {**owed, "s-c0-ep-9": "c0-ep-9"}  # a step the client spooled that never landed, with its episode
    assert check_steps(tables, lost)["missing"] == 1 and check_episodes(tables, lost)["missing"] == 1
    again = step_event("c0-ep-0", event_id="s-c0-ep-0")  # the same event landed twice (at another offset)
    log.sinks[STEPS].write([Record("steps", 0, 99, [step_row(again, 0, 99)])])
    assert check_steps(tables, owed)["duplicated"] == 1
    stray = step_event("c9-ep-0")  # in the table, owed by no client
    log.sinks[STEPS].write([Record("steps", 0, 100, [step_row(stray, 0, 100)])])
    assert check_steps(tables, owed)["unowed"] == 1


def test_the_ledger_knows_an_episode_a_client_was_killed_in_and_that_it_was_never_closed(tmp_path):
    log, owed = logged(tmp_path, episodes=2)  # two one-step episodes, each closed
    ledger = tmp_path / "c1.ledger"
    ledger.write_text("s-a c1-ep-0\ns-b c1-ep-0 end\n")
    assert open_episode(ledger) is None and open_episode(tmp_path / "none.ledger") is None  # between episodes
    ledger.write_text(ledger.read_text() + "s-c c1-ep-1\n")  # a step of the next one, then SIGKILL
    assert open_episode(ledger) == "c1-ep-1"
    owed |= read_client_ledgers([ledger])
    assert owed["s-b"] == "c1-ep-0" and len(owed) == 5  # a final step's line is owed like the others
    episodes = check_episodes(tmp_path / "tables", owed)
    assert episodes["missing"] == 2 and episodes["ended"] == {"success": 2}  # c1's two: never closed


def test_a_step_a_kill_caught_being_spooled_is_neither_owed_nor_a_stray_and_its_episode_must_close(tmp_path):
    log, owed = logged(tmp_path, episodes=2)
    ledger = tmp_path / "c1.ledger"  # killed after announcing its step, before confirming it: spooled or not
    ledger.write_text("spooling s-a c1-ep-0\ns-a c1-ep-0\nspooling s-b c1-ep-0 end\n")
    assert open_episode(ledger) == "c1-ep-0"  # its first step confirmed: whether the final one lands or not, it closes
    first = tmp_path / "c2.ledger"  # killed announcing a new episode's first step: maybe no step of it exists anywhere
    first.write_text("s-x c2-ep-0 end\nspooling s-y c2-ep-1\n")
    assert open_episode(first) is None
    owed, unconfirmed = owed | read_client_ledgers([ledger]), read_unconfirmed([ledger])
    assert "s-a" in owed and unconfirmed == {"s-b": "c1-ep-0"}
    tables = tmp_path / "tables"
    landed = step_event("c1-ep-0", 0, done=False, event_id="s-a"), step_event("c1-ep-0", 1, event_id="s-b")
    for offset, step in enumerate(landed, start=200):
        log.sinks[STEPS].write([Record("steps", 1, offset, [step_row(step, 1, offset)])])
    steps = check_steps(tables, owed, unconfirmed)  # the drain delivered it before the kill
    assert (steps["unowed"], steps["missing"], steps["unconfirmed_landed"]) == (0, 0, 1)
    assert check_steps(tables, owed)["unowed"] == 1  # without the announcement it would be a stray
    assert check_episodes(tables, owed, unconfirmed)["missing"] == 1  # c1-ep-0: landed steps, never closed
    stray = step_event("c9-ep-0")  # announced by no client: still a stray
    log.sinks[STEPS].write([Record("steps", 0, 100, [step_row(stray, 0, 100)])])
    assert check_steps(tables, owed, unconfirmed)["unowed"] == 1


def test_a_spool_left_with_unsent_events_fails_the_ledger(tmp_path):
    spools = tmp_path / "home" / "spool"
    Spool(spools / "f-c0", max_bytes=1 << 20).close()  # drained
    left = Spool(spools / "f-c1", max_bytes=1 << 20)
    left.append("steps", b"k", b"v1")
    left.append("steps", b"k", b"v2")
    left.close()
    found = check_spools(spools)
    assert found == {"spools": 2, "unsent": 2, "by_client": {"f-c0": 0, "f-c1": 2}}
    log, owed = logged(tmp_path)
    tables = tmp_path / "tables"
    report = {"steps": check_steps(tables, owed), "episodes": check_episodes(tables, owed), "spools": found,
              "dead_letters": check_dead_letters([], []), "versions": {"reused_ids": [], "problems": []}}  # fmt: skip
    assert not ledger_ok(report)
    assert ledger_ok(report | {"spools": check_spools(tmp_path / "no-spools")})


def test_dead_letters_must_be_exactly_the_injected_bad_events():
    injected = [b"\x00bad", b'{"kind": "step"}', b"x" * 10]
    assert check_dead_letters(injected[::-1], injected) == {
        "injected": 3, "dead_letters": 3, "unaccounted": 0, "not_dead_lettered": 0}  # fmt: skip
    found = check_dead_letters([*injected[:2], b"a good event dead-lettered by mistake"], injected)
    assert (found["unaccounted"], found["not_dead_lettered"]) == (1, 1)


def publish(tmp_path: Path, version: str, parent: str, key, lineage: dict, artifact: Path = RELEASE) -> str:
    """Store, sign and record a version as the learner does (without sending it); its artifact's URI."""
    uri, sha256 = store_artifact(artifact, tmp_path / "artifacts")
    event = ModelVersionEvent(new_event_id(), time.time(), version, parent, version.split("-")[0], uri, sha256,
                              lineage=lineage)  # fmt: skip
    write_manifest(msgspec.structs.replace(event, signature=sign(event, key)), tmp_path / "artifacts")
    return uri


def test_versions_verify_read_their_lineage_and_chain_without_a_restart(tmp_path):
    logged(tmp_path)
    key = load_or_create_key(tmp_path / "keys")
    trusted, tables, artifacts = tmp_path / "keys" / "trusted", tmp_path / "tables", tmp_path / "artifacts"
    publish(tmp_path, "sft-0001", "", key, {"steps": 0, "training_samples": 1})
    publish(tmp_path, "offline_rl-0002", "sft-0001", key, {"steps": 2})
    clean = check_versions(artifacts, tables, trusted)
    assert clean["published"] == 2 and not clean["reused_ids"] and not clean["problems"]

    publish(tmp_path, "online_rl-0003", "sft-0001", key, {"steps": 99})  # a restarted learner's parent; no v99
    problems = check_versions(artifacts, tables, trusted)["problems"]
    assert any("parent 'sft-0001'" in p for p in problems) and any("steps@99" in p for p in problems)

    other = tmp_path / "other.vla"
    other.write_bytes(RELEASE.read_bytes() + b"!")  # another artifact, stored under its own digest
    uri = publish(tmp_path, "online_rl-0004", "online_rl-0003", key, {}, artifact=other)
    Path(urlparse(uri).path).write_bytes(b"corrupted in the store")
    assert any("checksum mismatch" in p for p in check_versions(artifacts, tables, trusted)["problems"])


def test_a_version_id_published_twice_fails_the_ledger(tmp_path):
    logged(tmp_path)
    key = load_or_create_key(tmp_path / "keys")
    publish(tmp_path, "sft-0001", "", key, {})
    # A learner killed after sending but before its manifest counted the version would name the next one the same.
    (tmp_path / "artifacts" / "manifests" / "sft-0001.json").rename(tmp_path / "artifacts" / "manifests" / "a.json")
    publish(tmp_path, "sft-0001", "", key, {})
    versions = check_versions(tmp_path / "artifacts", tmp_path / "tables", tmp_path / "keys" / "trusted")
    assert versions["reused_ids"] == ["sft-0001"]
    report = {"steps": {"missing": 0, "duplicated": 0, "unowed": 0}, "episodes": {"missing": 0, "duplicated": 0},
              "dead_letters": {"unaccounted": 0, "not_dead_lettered": 0}, "versions": versions}  # fmt: skip
    assert not ledger_ok(report)


def test_version_ids_are_claimed_so_a_kill_between_sending_and_recording_never_reuses_one(tmp_path):
    from concurrent.futures import ThreadPoolExecutor

    from learner.daemon.publish import claim_version

    artifacts = tmp_path / "artifacts"
    first = claim_version(artifacts, "sft")  # then the learner dies before writing sft-0001's manifest
    assert first == "sft-0001" and claim_version(artifacts, "offline_rl") == "offline_rl-0002"
    with ThreadPoolExecutor(8) as pool:  # learners racing for the next ids
        claimed = list(pool.map(lambda _: claim_version(artifacts, "online_rl"), range(16)))
    assert sorted(int(v.rsplit("-", 1)[1]) for v in claimed) == list(range(3, 19))


def test_a_learner_kill_counts_as_continued_only_when_the_stage_it_hit_resumed_from_its_checkpoint():
    versions = [
        {"model_version": "sft-0001", "stage": "sft", "published_at": 100.0, "resumed_from_step": 0},
        {"model_version": "dagger-0002", "stage": "dagger", "published_at": 300.0, "resumed_from_step": 150},
        {"model_version": "dagger-0003", "stage": "dagger", "published_at": 500.0, "resumed_from_step": 0},
    ]
    kills = [
        {"at": 200.0, "in_progress": "dagger", "checkpointed": True},  # resumed at step 150: continued
        {"at": 400.0, "in_progress": "dagger", "checkpointed": True},  # retrained from step 0: restarted
        {"at": 450.0, "in_progress": "dagger", "checkpointed": False},  # no checkpoint yet: step 0 is right
        {"at": 150.0, "in_progress": "", "checkpointed": False},  # between stages: any next version
        {"at": 600.0, "in_progress": "dagger", "checkpointed": True},
    ]  # nothing published after it
    found = check_learner_kills(kills, versions)
    assert [k["continued"] for k in found] == [True, False, True, True, False]
    assert [k["next_version"] for k in found] == ["dagger-0002", "dagger-0003", "dagger-0003", "dagger-0002", None]
    assert found[0]["resumed_from_step"] == 150
    assert [k["published_after_s"] for k in found] == [100.0, 100.0, 50.0, 150.0, None]
