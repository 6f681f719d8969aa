"""faust's aiokafka transport with a short consumer fetch wait (faust fixes it at 1.5 s).

aiokafka does not re-fetch a partition while its records are still pending in the consumer, so the fetch
sent meanwhile holds only the quiet partitions (episodes, at times all of them) and the broker keeps it for
the whole fetch wait when they have nothing new. Fresh steps then sat in the broker for up to 1.5 s, which
stalled the backlog drain and set the end-to-end p99. The cost of a short wait is a few more empty fetch
requests per second on an idle topic.
"""

from __future__ import annotations

import aiokafka
from faust.transport import drivers
from faust.transport.drivers import aiokafka as faust_aiokafka

SCHEME = "flywheel-kafka"
FETCH_MAX_WAIT_MS = 100


class ConsumerThread(faust_aiokafka.AIOKafkaConsumerThread):
    def _create_worker_consumer(self, transport: faust_aiokafka.Transport) -> aiokafka.AIOKafkaConsumer:
        consumer = super()._create_worker_consumer(transport)
        consumer._fetch_max_wait_ms = FETCH_MAX_WAIT_MS  # read when start() builds the fetcher
        return consumer


class Consumer(faust_aiokafka.Consumer):
    def _new_consumer_thread(self) -> ConsumerThread:
        return ConsumerThread(self, loop=self.loop, beacon=self.beacon)


class Transport(faust_aiokafka.Transport):
    Consumer = Consumer


drivers.TRANSPORTS[SCHEME] = f"{__name__}:Transport"
