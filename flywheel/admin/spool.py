"""`flywheel spool replay`: send a dead edge client's spool to Kafka, for a client that never comes back.

A client's own next run sends what an earlier run left in its spool (edge_client.spool); this does the same from
an operator's shell: it opens that client's spool (refused while any process holds it: the client alive, or
another replay), sends every record as it was spooled, oldest first (each to the topic it was spooled for, with
its event_id), moves the cursor past each acknowledged batch and empties the file once all are in. A second replay
finds nothing to send; a replay killed part-way resumes at the cursor, and the one batch it may send twice (killed
between Kafka's acknowledgement and the cursor write) is dropped by event_id in the sinks.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from core.settings import Settings
from edge_client.spool import Spool, SpoolingPublisher, spool_dir
from streams.kafka_clients import make_producer


class NoSpool(RuntimeError):
    """No spool under that home for that client id: a typo, or the wrong FLYWHEEL_HOME."""


@dataclass(frozen=True)
class SpoolReplayConfig:
    client_id: str
    """The edge client whose spool is sent: $FLYWHEEL_HOME/spool/<client id>."""
    client_home: Path | None = None
    """The FLYWHEEL_HOME that client ran with (none: this command's own FLYWHEEL_HOME, ~/.cache/flywheel unless
    set). Kafka is this command's: FLYWHEEL_BOOTSTRAP_SERVERS and the security settings."""
    timeout_s: float = 300.0
    """How long to wait for Kafka to acknowledge the whole spool; what it has not acknowledged by then stays spooled
    for the next replay."""


@dataclass(frozen=True)
class ReplayResult:
    client_id: str
    spool: str
    sent: int  # acknowledged by Kafka and gone from the spool
    left: int  # still spooled (Kafka unreachable within the timeout)


def replay_spool(config: SpoolReplayConfig, settings: Settings) -> ReplayResult:
    """Send client `config.client_id`'s spool to Kafka and empty it. SpoolInUse while another process holds it;
    NoSpool when that client never spooled under that home."""
    try:
        directory = spool_dir(config.client_home or settings.home, config.client_id)
    except ValueError as error:  # an id with a '/' or '..' names no client's spool, and no path outside the home
        raise NoSpool(str(error)) from None
    if not (directory / "spool.log").exists():  # Spool() would make an empty one and report success
        raise NoSpool(f"no edge spool at {directory}: no client {config.client_id!r} ran with that FLYWHEEL_HOME")
    spool = Spool(directory)  # replay only sends: no append meets the bound
    owed = spool.pending_records
    # Named apart from the client in the broker's logs: these sends are the operator's, not that client's.
    publisher = SpoolingPublisher(spool, lambda: make_producer(settings, f"spool-replay-{config.client_id}"))
    left = publisher.close(timeout_s=config.timeout_s)
    return ReplayResult(config.client_id, str(directory), owed - left, left)
