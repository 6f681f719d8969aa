"""An edge client's publishing half for tests (tests/test_spool.py): steps through the real on-disk spool and
producer, in a process of its own, with the spool an edge client has, $FLYWHEEL_HOME/spool/CLIENT_ID.

    python -m tests.spool_client CLIENT_ID IDS_FILE STEPS [--die-after-ack] [--cut-after N]

--die-after-ack: SIGKILLed right after Kafka acknowledges its first batch, before the spool's cursor says so (the
one place where an edge client's death duplicates events in the log).
--cut-after N: Kafka takes the first N records, then the client is cut off from it: it keeps everything after
them spooled and keeps trying, as a client behind a cut network does, until the test kills it.

Settings come from the FLYWHEEL_* environment. The event_ids of the steps it spools are appended to IDS_FILE.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from pathlib import Path

from kafka.errors import KafkaTimeoutError

from core.settings import Settings
from edge_client.spool import Spool, SpooledRecord, SpoolingPublisher, spool_dir
from schemas import encode_event
from streams.kafka_clients import make_producer
from streams.topics import topics_for
from tests.factories import step_event

BATCH = 100  # records per send: the first acknowledged batch is a fraction of what a test spools
CUT_OFF_FOR_S = 3600.0  # a cut-off client keeps trying this long: the test kills it first


def die(_records: list[SpooledRecord]) -> None:
    os.kill(os.getpid(), signal.SIGKILL)


class CutAfter:
    """The real producer for the first `records` sends; every later send reaches nothing and every flush after it
    times out, as kafka-python's does when its only route to the cluster is cut (record_accumulator's
    await_flush_completion). So what follows the first `records` is never written, and stays spooled."""

    def __init__(self, producer, records: int):
        self.producer, self.left, self.cut = producer, records, False

    def send(self, topic, key, value):
        if self.left <= 0:
            self.cut = True
            return None
        self.left -= 1
        return self.producer.send(topic, key=key, value=value)

    def flush(self, timeout=None):
        if self.cut:
            raise KafkaTimeoutError("cut off (tests.spool_client --cut-after)")
        self.producer.flush(timeout=timeout)

    def close(self, timeout=None):
        self.producer.close(timeout=timeout)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("client_id")
    parser.add_argument("ids_file", type=Path)
    parser.add_argument("steps", type=int)
    parser.add_argument("--die-after-ack", action="store_true")
    parser.add_argument("--cut-after", type=int, default=None)
    args = parser.parse_args()
    settings = Settings()
    spool = Spool(spool_dir(settings.home, args.client_id))
    topic = topics_for(settings).steps.name
    run = f"{args.client_id}-{os.getpid()}"  # episode ids of this run alone: a restarted client starts new ones
    episodes = [f"{run}-click-test-{n}-{n}" for n in range(args.steps // 3 + 1)]
    steps = [step_event(episodes[n // 3], step=n % 3, done=n % 3 == 2) for n in range(args.steps)]
    with open(args.ids_file, "a") as ids:  # spooled before the drain starts: nothing races the kill
        for step in steps:
            spool.append(topic, step.episode_id.encode(), encode_event(step))
            ids.write(step.event_id + "\n")

    def producer():
        real = make_producer(settings, args.client_id)
        return real if args.cut_after is None else CutAfter(real, args.cut_after)

    publisher = SpoolingPublisher(
        spool, producer, on_acknowledged=die if args.die_after_ack else lambda records: None, batch=BATCH
    )
    return 0 if publisher.close(timeout_s=60 if args.cut_after is None else CUT_OFF_FOR_S) == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
