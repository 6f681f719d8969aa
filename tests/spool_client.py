"""An edge client's publishing half for tests (tests/test_spool.py): steps through the real on-disk spool and
producer, in a process of its own, optionally SIGKILLed right after Kafka acknowledges its first batch and
before the spool's cursor says so (the one place where an edge client's death duplicates events in the log).

    python -m tests.spool_client SPOOL_DIR IDS_FILE STEPS [--die-after-ack]

Settings come from the FLYWHEEL_* environment. The event_ids of the steps it spools are appended to IDS_FILE.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from pathlib import Path

from core.settings import Settings
from edge_client.spool import Spool, SpooledRecord, SpoolingPublisher
from schemas import encode_event
from streams.kafka_clients import make_producer
from streams.topics import topics_for
from tests.factories import step_event

BATCH = 100  # records per send: the first acknowledged batch is a fraction of what a test spools


def die(_records: list[SpooledRecord]) -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("spool_dir", type=Path)
    parser.add_argument("ids_file", type=Path)
    parser.add_argument("steps", type=int)
    parser.add_argument("--die-after-ack", action="store_true")
    args = parser.parse_args()
    settings = Settings()
    spool = Spool(args.spool_dir, settings.edge_spool_max_bytes)
    topic = topics_for(settings).steps.name
    client = f"spool{os.getpid()}"
    episodes = [f"{client}-click-test-{n}-{n}" for n in range(args.steps // 3 + 1)]
    steps = [step_event(episodes[n // 3], step=n % 3, done=n % 3 == 2) for n in range(args.steps)]
    with open(args.ids_file, "a") as ids:  # spooled before the drain starts: nothing races the kill
        for step in steps:
            spool.append(topic, step.episode_id.encode(), encode_event(step))
            ids.write(step.event_id + "\n")
    publisher = SpoolingPublisher(
        spool,
        lambda: make_producer(settings, client),
        on_acknowledged=die if args.die_after_ack else lambda records: None,
        batch=BATCH,
    )
    return 0 if publisher.close(timeout_s=60) == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
