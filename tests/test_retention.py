"""What the learner keeps as it publishes for hours: the newest versions and the needed ones in the store, the
lineage of every version readable after its artifact is gone, and only the runs a stage starts from again."""

from __future__ import annotations

from pathlib import Path

from flywheel.chaos.ledger import check_versions
from learner.daemon.retention import held, prune_runs
from registry.signing import load_or_create_key
from registry.store import RETIRED, ancestry, read_manifest, read_manifests, retire, versions_to_retire
from tests.test_ledger import RELEASE, logged, publish


def test_retiring_keeps_the_newest_and_the_needed_and_the_chain_still_reads(tmp_path):
    logged(tmp_path)
    key, artifacts = load_or_create_key(tmp_path / "keys"), tmp_path / "artifacts"
    names = ["sft-0001", "dagger-0002", "online_rl-0003", "online_rl-0004", "online_rl-0005"]
    uris = {}
    for n, (parent, version) in enumerate(zip(["", *names], names, strict=False)):
        artifact = tmp_path / f"{version}.vla"
        artifact.write_bytes(RELEASE.read_bytes() + version.encode())  # bytes of its own
        uris[version] = publish(tmp_path, version, parent, key, {"steps": n % 3}, artifact=artifact)
    manifests = read_manifests(artifacts)
    retiring = versions_to_retire(manifests, keep_last=2, needed={"dagger-0002"})  # a channel's head, say
    assert [m["version"] for m in retiring] == ["sft-0001", "online_rl-0003"]
    assert versions_to_retire(manifests, keep_last=9, needed=set()) == []

    live_digests = {m["sha256"] for m in manifests if m not in retiring}
    for manifest in retiring:
        retire(artifacts, manifest, live_digests)
    assert [m["version"] for m in read_manifests(artifacts)] == ["dagger-0002", "online_rl-0004", "online_rl-0005"]
    assert [m["version"] for m in read_manifests(artifacts, folder=RETIRED)] == ["sft-0001", "online_rl-0003"]
    assert read_manifest(artifacts, "sft-0001") is None
    assert (
        not Path(uris["sft-0001"].removeprefix("file://")).exists()
        and Path(uris["dagger-0002"].removeprefix("file://")).exists()
    )
    # Who descends from whom outlives the artifacts: the twin walks back to the first SFT through retired versions.
    assert [m["version"] for m in ancestry(artifacts, "online_rl-0005")] == names[::-1]
    books = check_versions(artifacts, tmp_path / "tables", tmp_path / "keys" / "trusted")
    assert books["problems"] == [] and books["retired"] == 2 and books["published"] == 5


def test_an_artifact_a_live_version_names_is_kept_and_a_retirement_cut_short_counts_once(tmp_path):
    logged(tmp_path)
    key, artifacts = load_or_create_key(tmp_path / "keys"), tmp_path / "artifacts"
    shared = publish(tmp_path, "sft-0001", "", key, {})  # both versions name the release's bytes
    publish(tmp_path, "online_rl-0002", "sft-0001", key, {})
    first, second = read_manifests(artifacts)
    retire(artifacts, first, {second["sha256"]})
    assert Path(shared.removeprefix("file://")).exists()  # the live version's bytes stay
    # Killed between writing the retired copy and deleting the live one: the next retirement finishes it; meanwhile
    # the books count the version once.
    copy = (artifacts / "manifests" / "online_rl-0002.json").read_bytes()
    (artifacts / RETIRED / "online_rl-0002.json").write_bytes(copy)
    books = check_versions(artifacts, tmp_path / "tables", tmp_path / "keys" / "trusted")
    assert books["reused_ids"] == [] and books["problems"] == [] and books["retired"] == 1
    retire(artifacts, second, set())
    assert not Path(shared.removeprefix("file://")).exists() and read_manifests(artifacts) == []


def test_only_the_runs_a_stage_starts_from_again_survive(tmp_path):
    for name in ("sft-at-3-3-3", "dagger-at-9-9-9", "online-after-9-9-9", "offline-at-5-5-5", "twin-of-v7"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "vla_checkpoint.pt").write_bytes(b"w")
    (tmp_path / "state.json").write_text("{}")
    pruned = prune_runs(tmp_path, {"sft-at-3-3-3", "dagger-at-9-9-9", "online-after-9-9-9"})
    assert pruned == ["offline-at-5-5-5"]
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "dagger-at-9-9-9", "online-after-9-9-9", "sft-at-3-3-3", "state.json", "twin-of-v7"]  # fmt: skip


def test_an_operator_holds_a_version_with_a_file(tmp_path):
    from core.settings import Settings

    settings = Settings(data_dir=str(tmp_path / "data"))
    assert held(settings) == set()
    (Path(settings.artifacts_dir) / "keep").mkdir(parents=True)
    (Path(settings.artifacts_dir) / "keep" / "online_rl-0042").touch()
    assert held(settings) == {"online_rl-0042"}
