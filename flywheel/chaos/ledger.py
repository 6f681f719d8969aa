"""The ledger check after a run under faults (`flywheel chaos`): what every party owes the tables, against what the
tables hold.

    steps          every event_id a client recorded as spooled (edge_client.runner's ledger) is in `steps` exactly
                   once, and `steps` holds nothing else but steps a kill caught being spooled (announced, never
                   confirmed: each may have landed or not)
    episodes       every episode those steps belong to is closed exactly once: in `episodes` once, complete or
                   abandoned (a client killed mid-episode never sends its final step), and none is left open
    spools         no client's spool holds an unsent event once the clients have stopped
    dead letters   every dead letter is an injected bad event (by the digest of its bytes), each exactly once
    versions       every published version verifies (signature by a trusted key, artifact digest), its lineage
                   reads (each table at the version it trained on), no version id is used twice, and the learner
                   continued rather than restarted: each version's parent is the version published before it
    learner kills  a stage the learner was killed in is the stage its next version comes from, resumed from the
                   checkpoint it had written (learner.daemon.loop: not the curriculum, nor the stage, from scratch)
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Iterable
from pathlib import Path

import msgspec
import polars as pl

from core.console import say
from core.object_store import Location
from core.processes import wait_until
from core.settings import Settings
from edge_client.spool import Spool
from lake.queries import scan_table
from lake.tables import EPISODES, STEPS, open_table, scan, table_exists, table_uri
from registry.signing import TrustedKeys
from registry.store import RETIRED, ModelRejected, fetch_verified, read_manifests
from schemas import ModelVersionEvent

SIGNED_FIELDS = tuple(ModelVersionEvent.__struct_fields__)


def read_client_ledgers(paths: Iterable[Path]) -> dict[str, str]:
    """event_id -> episode_id of every step the clients spooled (lines 'event_id episode_id', ' end' after an
    episode's final step: edge_client.runner; a line cut mid-write is not a step the client finished recording, so
    it is skipped)."""
    return read_ledgers(paths)[0]


def read_unconfirmed(paths: Iterable[Path]) -> dict[str, str]:
    """event_id -> episode_id of the steps a client announced ('spooling event_id episode_id') but was killed before
    confirming: whether the spool took each is unknown, so each may land or not."""
    return read_ledgers(paths)[1]


def read_ledgers(paths: Iterable[Path]) -> tuple[dict[str, str], dict[str, str]]:
    """(read_client_ledgers, read_unconfirmed) of `paths`, read once."""
    owed: dict[str, str] = {}
    announced: dict[str, str] = {}
    for path in paths:
        for line in Path(path).read_text().splitlines():
            parts = line.split()
            announcing = parts[:1] == ["spooling"]
            step = parts[1:] if announcing else parts
            if len(step) == 2 or (len(step) == 3 and step[2] == "end"):
                (announced if announcing else owed)[step[0]] = step[1]
    return owed, {e: episode for e, episode in announced.items() if e not in owed}


def open_episode(path: Path) -> str | None:
    """The episode a client's ledger shows it in the middle of (its last confirmed step not a final one), or None
    (between episodes, or no ledger yet). A step announced but not confirmed does not open an episode: killed before
    its spool took it, the episode would have no step anywhere, and no worker could ever close it."""
    lines = path.read_text().splitlines() if path.exists() else []
    confirmed = [line.split() for line in lines if not line.startswith("spooling ")]
    return confirmed[-1][1] if confirmed and len(confirmed[-1]) == 2 else None


def closed_episodes(tables_dir: Location, episode_ids: set[str]) -> int:
    """How many of `episode_ids` have their row in `episodes` (complete or abandoned)."""
    episodes = scan_table(tables_dir, EPISODES)
    if episodes is None:
        return 0
    return (
        episodes.filter(pl.col("episode_id").is_in(sorted(episode_ids))).select("episode_id").unique().collect().height
    )


def drain(tables_dir: Location, ledgers: list[Path], abandon_after_s: float, timeout_s: float = 600.0) -> None:
    """Wait until every step the clients' `ledgers` owe is in Delta and every episode of them (and of the announced
    steps that landed) is closed, the last ones abandoned by the workers' idle check (`abandon_after_s` past their
    last step), or the timeout: the ledger check then says what is missing or open."""
    owed, unconfirmed = read_ledgers(ledgers)
    try:
        wait_until(lambda: check_steps(tables_dir, owed)["missing"] == 0, timeout_s, interval=5,
                   what=f"{len(owed)} owed steps in Delta")  # fmt: skip
        wait_until(lambda: closed_episodes(tables_dir, wanted := owed_episodes(tables_dir, owed, unconfirmed))
                   >= len(wanted), abandon_after_s + 120, interval=5, what="the owed episodes closed")  # fmt: skip
    except TimeoutError as error:
        say(f"ledger: {error}")


def check_steps(tables_dir: Location, owed: dict[str, str], unconfirmed: dict[str, str] | None = None) -> dict:
    """`owed` in `steps` exactly once; nothing else there but `unconfirmed` steps that landed (each at most once)."""
    unconfirmed = unconfirmed or {}
    found = _counts(tables_dir, STEPS, "event_id")
    missing = sorted(set(owed) - set(found))
    duplicated = sorted(e for e, n in found.items() if n > 1)
    unowed = sorted(set(found) - set(owed) - set(unconfirmed))
    return {"owed": len(owed), "in_table": sum(found.values()), "missing": len(missing), "duplicated": len(duplicated),
            "unowed": len(unowed), "unconfirmed": len(unconfirmed),
            "unconfirmed_landed": len(set(unconfirmed) & set(found)),
            "examples": {"missing": missing[:5], "duplicated": duplicated[:5], "unowed": unowed[:5]}}  # fmt: skip


def check_episodes(tables_dir: Location, owed: dict[str, str], unconfirmed: dict[str, str] | None = None) -> dict:
    """Every episode of the owed steps, and of the unconfirmed ones that landed, closed once; `missing` ones are still
    open, `ended` counts how they closed."""
    episodes = owed_episodes(tables_dir, owed, unconfirmed or {})
    found = _counts(tables_dir, EPISODES, "episode_id")
    missing = sorted(episodes - set(found))
    duplicated = sorted(e for e, n in found.items() if n > 1)
    examples = {"missing": missing[:5], "duplicated": duplicated[:5]}
    return {"owed": len(episodes), "in_table": sum(found.values()), "missing": len(missing),
            "duplicated": len(duplicated), "ended": _endings(tables_dir, episodes), "examples": examples}  # fmt: skip


def owed_episodes(tables_dir: Location, owed: dict[str, str], unconfirmed: dict[str, str]) -> set[str]:
    """The episodes that must close: those of the owed steps, and of the announced steps that landed."""
    landed = set(_counts(tables_dir, STEPS, "event_id")) if unconfirmed else set()
    return set(owed.values()) | {episode for e, episode in unconfirmed.items() if e in landed}


def check_books(settings: Settings, ledgers: list[Path], letters: Iterable[bytes], injected: Iterable[bytes]) -> dict:
    """The books of a run whose clients wrote `ledgers`, whose dead-letter topic holds `letters`, and into whose
    steps topic `injected` bad events went."""
    owed, unconfirmed = read_ledgers(ledgers)
    versions = check_versions(settings.artifacts_dir, settings.tables_dir, settings.keys_dir / "trusted")
    return {"steps": check_steps(settings.tables_dir, owed, unconfirmed),
            "episodes": check_episodes(settings.tables_dir, owed, unconfirmed),
            "spools": check_spools(settings.home / "spool"), "dead_letters": check_dead_letters(letters, injected),
            "versions": versions}  # fmt: skip


def check_spools(spools_dir: Path) -> dict:
    """The events still unsent in the client spools under `spools_dir` ($FLYWHEEL_HOME/spool), after the clients
    stopped."""
    unsent = {}
    for directory in sorted(p for p in spools_dir.glob("*") if (p / "spool.log").exists()):
        spool = Spool(directory, max_bytes=0)
        unsent[directory.name] = spool.pending_records
        spool.close()
    return {"spools": len(unsent), "unsent": sum(unsent.values()), "by_client": unsent}


def check_dead_letters(letters: Iterable[bytes], injected: Iterable[bytes]) -> dict:
    """Each injected bad event dead-lettered once, and nothing else dead-lettered (compared by sha256)."""
    have = Counter(hashlib.sha256(value).hexdigest() for value in letters)
    want = Counter(hashlib.sha256(value).hexdigest() for value in injected)
    return {"injected": sum(want.values()), "dead_letters": sum(have.values()),
            "unaccounted": sum((have - want).values()), "not_dead_lettered": sum((want - have).values())}  # fmt: skip


def check_versions(artifacts_dir: Location, tables_dir: Location, trusted_dir: Path) -> dict:
    """Each live version verified (signature, digest, lineage); every version, retired ones too
    (learner.daemon.retention), in one chain of parents and no id twice."""
    live = read_manifests(artifacts_dir, skip_unreadable=False)  # an unreadable manifest fails the check
    alive = {m["version"] for m in live}  # a retirement cut short leaves both copies: the live one counts
    retired = [
        m for m in read_manifests(artifacts_dir, skip_unreadable=False, folder=RETIRED) if m["version"] not in alive
    ]
    manifests = sorted(live + retired, key=lambda m: float(m["produced_at"]))
    trusted, problems = TrustedKeys(trusted_dir), []
    ids = [m["version"] for m in manifests]
    reused = sorted(v for v, n in Counter(ids).items() if n > 1)
    for previous, manifest in zip([None, *manifests], manifests, strict=False):
        version = manifest["version"]
        if previous is not None and manifest.get("parent") != previous["version"]:
            problems.append(f"{version}: parent {manifest.get('parent')!r}, but {previous['version']} was published "
                            "before it")  # fmt: skip
        if manifest in retired:
            continue
        event = msgspec.convert({k: manifest[k] for k in SIGNED_FIELDS if k in manifest}, ModelVersionEvent)
        try:
            trusted.verify(event)
            fetch_verified(event.artifact_uri, event.sha256)
        except ModelRejected as error:
            problems.append(f"{version}: {error}")
        for table, table_version in event.lineage.items():
            uri = table_uri(tables_dir, table)
            if not table_exists(uri):
                problems.append(f"{version}: lineage table {table} is gone")
                continue
            try:
                open_table(uri, table_version)
            except Exception as error:  # noqa: BLE001 - any failure to load that version is the finding
                problems.append(f"{version}: {table}@{table_version} does not load: {error!r}")
    return {"published": len(ids), "retired": len(retired), "reused_ids": reused, "problems": problems,
            "versions": ids}  # fmt: skip


def check_learner_kills(kills: list[dict], versions: list[dict]) -> list[dict]:
    """Each learner kill ({at: unix time, in_progress: the stage being trained or "", checkpointed: whether that stage
    had written a checkpoint}) with the first version the daemon published after it (its state's `versions`
    entries), how long after the kill, and whether it continued: the same stage, resumed from a step > 0 when a
    checkpoint was there."""
    found = []
    for kill in kills:
        after = next((v for v in versions if v["published_at"] > kill["at"]), None)
        stage = after["stage"] if after else None
        resumed = after.get("resumed_from_step", 0) if after else None
        continued = after is not None and (not kill["in_progress"] or (
            stage == kill["in_progress"] and (resumed > 0 or not kill["checkpointed"])))  # fmt: skip
        found.append(kill | {"next_version": after["model_version"] if after else None, "next_stage": stage,
                             "published_after_s": round(after["published_at"] - kill["at"], 1) if after else None,
                             "resumed_from_step": resumed, "continued": continued})  # fmt: skip
    return found


def ledger_ok(report: dict) -> bool:
    steps, episodes, letters, versions = (report[k] for k in ("steps", "episodes", "dead_letters", "versions"))
    return (
        steps["missing"] == steps["duplicated"] == steps["unowed"] == 0
        and episodes["missing"] == episodes["duplicated"] == 0
        and report.get("spools", {}).get("unsent", 0) == 0
        and letters["unaccounted"] == letters["not_dead_lettered"] == 0
        and not versions["reused_ids"]
        and not versions["problems"]
    )


def _endings(tables_dir: Location, episode_ids: set[str]) -> dict[str, int]:
    """How the episodes `episode_ids` ended, as `episodes` says: termination -> count."""
    uri = table_uri(tables_dir, EPISODES)
    if not table_exists(uri):
        return {}
    ended = (scan(uri, columns=["episode_id", "termination"]).filter(pl.col("episode_id").is_in(sorted(episode_ids)))
             .group_by("termination").agg(pl.len()).collect())  # fmt: skip
    return dict(zip(ended["termination"].to_list(), ended["len"].to_list(), strict=True))


def _counts(tables_dir: Location, table: str, column: str) -> dict[str, int]:
    uri = table_uri(tables_dir, table)
    if not table_exists(uri):
        return {}
    counted = scan(uri, columns=[column]).group_by(column).agg(pl.len()).collect()
    return dict(zip(counted[column].to_list(), counted["len"].to_list(), strict=True))
