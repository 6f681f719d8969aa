"""faust's aiokafka transport, changed where the worker's throughput was measured to go (faust 0.15).

1. A short consumer fetch wait (faust fixes it at 1.5 s). aiokafka does not re-fetch a partition while
   its records are still pending in the consumer, so the fetch sent meanwhile holds only the quiet
   partitions (episodes, at times all of them) and the broker keeps it for the whole wait when they have
   nothing new: fresh steps sat in the broker for up to 1.5 s, which stalled the backlog drain and set the
   end-to-end p99. The cost is a few more empty fetch requests per second on an idle topic.
2. A leaner delivery of each fetched message to the streams. faust races every delivery against "flow
   suspended" with `Service.wait_first`, which makes four tasks per message (the delivery, suspend,
   stopped, crashed) and cancels three: a fifth of the worker's CPU. Here a delivery is one task raced
   against one future per fetched batch that completes on the same three conditions. Semantics are
   faust's: a delivery still pending when the flow is suspended (a rebalance) or the consumer stops is
   cancelled, like the deliveries that follow while it stays suspended.
3. A rewind that reaches partitions nothing was committed for yet. faust seeks every assigned partition back to
   its committed offset whenever it resumes the flow (after a rebalance, and when asked to fetch while the flow is
   stopped), and drops the events its stream queues held. aiokafka's `seek_to_committed` seeks only where an
   offset above 0 is committed, so a partition without one kept the fetch position past the dropped events: the
   30-minute chaos run lost the first record of an episodes partition (offset 0, read during the group's first
   rebalance) that way. Such a partition is rewound to its beginning instead, the consumer's `earliest` reset; the
   Delta sinks drop what they already hold by offset.
"""

from __future__ import annotations

import asyncio
from typing import cast

import aiokafka
from faust.transport import drivers
from faust.transport.consumer import CONSUMER_FETCHING
from faust.transport.drivers import aiokafka as faust_aiokafka
from mode import Service

SCHEME = "flywheel-kafka"
FETCH_MAX_WAIT_MS = 100


async def rewind_to_committed(consumer: aiokafka.AIOKafkaConsumer) -> dict[aiokafka.TopicPartition, int | None]:
    """Seek every assigned partition to its committed offset, and one with none committed (or 0) to its beginning;
    return the committed offsets (None where there is none), as aiokafka's `seek_to_committed` does."""
    committed = await consumer.seek_to_committed()
    uncommitted = [tp for tp, offset in committed.items() if not offset]
    if uncommitted:
        await consumer.seek_to_beginning(*uncommitted)
    return committed


class ConsumerThread(faust_aiokafka.AIOKafkaConsumerThread):
    def _create_worker_consumer(self, transport: faust_aiokafka.Transport) -> aiokafka.AIOKafkaConsumer:
        consumer = super()._create_worker_consumer(transport)
        consumer._fetch_max_wait_ms = FETCH_MAX_WAIT_MS  # read when start() builds the fetcher
        return consumer

    async def seek_to_committed(self) -> dict[aiokafka.TopicPartition, int | None]:
        return await self.call_thread(rewind_to_committed, self._ensure_consumer())


class Consumer(faust_aiokafka.Consumer):
    def _new_consumer_thread(self) -> ConsumerThread:
        return ConsumerThread(self, loop=self.loop, beacon=self.beacon)

    async def _drain_messages(self, fetcher: Service) -> None:
        """faust's Consumer._drain_messages (0.15.3) with `_deliver` in place of its per-message wait_first."""
        consumer_should_stop = cast(Service, self)._stopped.is_set
        fetcher_should_stop = fetcher._stopped.is_set
        read_offset = self._read_offset
        acks_enabled_for = self.app.topics.acks_enabled_for
        try:
            while not (consumer_should_stop() or fetcher_should_stop()):
                self.diag.set_flag(CONSUMER_FETCHING)
                batch = self.getmany(timeout=1.0)
                await asyncio.sleep(0)  # getmany may return at once, again and again: let the loop run
                if not self.should_stop:
                    interrupted = self._interruption()
                    try:
                        delivered = 0
                        async for tp, message in batch:
                            delivered += 1
                            if delivered % 100 == 0:
                                await asyncio.sleep(0)
                            offset, last = message.offset, read_offset.get(tp)
                            if last is not None and offset < last:
                                continue  # already delivered (faust drops these as well)
                            if last and offset - last > 1 and acks_enabled_for(message.topic):
                                await self._add_gap(tp, last + 1, offset)
                            if self._commit_every is not None and self._n_acked >= self._commit_every:
                                self._n_acked = 0
                                await self.commit()
                            if interrupted.done() and not self.suspend_flow.is_set():  # resumed since
                                interrupted = self._interruption()
                            await self._deliver(message, interrupted)
                            read_offset[tp] = offset
                    finally:
                        interrupted.cancel()
                self.diag.unset_flag(CONSUMER_FETCHING)
        except self.consumer_stopped_errors:
            if self.transport.app.should_stop:
                return
            raise
        except asyncio.CancelledError:
            if self.transport.app.should_stop:
                return
            raise
        except Exception as exc:
            self.log.exception("Drain messages raised: %r", exc)
            raise
        finally:
            self.diag.unset_flag(CONSUMER_FETCHING)

    def _interruption(self) -> asyncio.Future:
        """Completes when the flow is suspended or the consumer stops or crashes (wait_first's conditions)."""
        return asyncio.ensure_future(self.wait_first(self.suspend_flow.wait()))

    async def _deliver(self, message: object, interrupted: asyncio.Future) -> None:
        delivery = asyncio.ensure_future(self.callback(message))
        if not interrupted.done():
            await asyncio.wait((delivery, interrupted), return_when=asyncio.FIRST_COMPLETED)
        if delivery.done():
            delivery.result()  # a failed delivery raises here, as it would under wait_first
        else:
            delivery.cancel()


class Transport(faust_aiokafka.Transport):
    Consumer = Consumer


drivers.TRANSPORTS[SCHEME] = f"{__name__}:Transport"
