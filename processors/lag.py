"""Consumer lag under kafka_exporter's names, read from the offsets the sinks record in their Delta commits."""

from __future__ import annotations

import contextlib
import logging
import threading
import time

from prometheus_client import REGISTRY
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from core.settings import Settings

log = logging.getLogger(__name__)


class LagExporter(Collector):
    """Broker and consumer-lag metrics, named as kafka_exporter names them so standard dashboards apply.

    The sinks do not use Kafka group commits for correctness: the offsets in the Delta commits are the
    truth (processors.delta_sink). So a sink's "committed offset" is the Delta-recorded last offset + 1,
    and lag = topic end offset - that. consumergroup = the sink (= the Delta table it writes).

    A thread polls every `interval` s (one ListOffsets request, one incremental Delta log read per
    table); a scrape only reads the last snapshot, so it never waits on Kafka.
    """

    def __init__(self, settings: Settings, interval: float = 2.0):
        from lake.tables import EPISODES, STEPS, TRAINING_SAMPLES
        from streams.topics import topics_for

        topics = topics_for(settings)
        self.settings = settings
        self.interval = interval
        self.sinks = {STEPS: topics.steps.name, EPISODES: topics.episodes.name, TRAINING_SAMPLES: topics.episodes.name}
        self.topics = [t.name for t in topics.all()]
        self.model_versions_topic = topics.model_versions.name
        self._families: list = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="lag-exporter", daemon=True)
        self._consumer = None
        self._tables: dict = {}
        self._latest_model: tuple[int, object] | None = None  # (offset, ModelVersionEvent)

    def start(self) -> LagExporter:
        REGISTRY.register(self)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(10)
        with contextlib.suppress(KeyError):
            REGISTRY.unregister(self)
        if self._consumer is not None:
            self._consumer.close()

    def collect(self):
        return iter(self._families)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self._families = self.poll()
            except Exception as error:  # noqa: BLE001 - a broker outage must not kill the worker
                log.warning("lag exporter: %s", error)
                up = GaugeMetricFamily("flywheel_kafka_up", "1 if the last broker poll succeeded")
                up.add_metric([], 0)
                self._families = [up]
                self._close_consumer()
            self._stop.wait(self.interval)

    def _close_consumer(self) -> None:
        if self._consumer is not None:
            with contextlib.suppress(Exception):
                self._consumer.close()
            self._consumer = None

    def poll(self) -> list:
        from kafka import TopicPartition

        from streams.kafka_clients import make_consumer

        if self._consumer is None:
            self._consumer = make_consumer(self.settings, "flywheel-lag-exporter")
        consumer = self._consumer
        partitions = []
        for topic in self.topics:
            for partition in sorted(consumer.partitions_for_topic(topic) or ()):
                partitions.append(TopicPartition(topic, partition))
        ends = consumer.end_offsets(partitions) if partitions else {}
        brokers = len(consumer._client.cluster.brokers())  # kafka-python keeps the cluster metadata here

        up = GaugeMetricFamily("flywheel_kafka_up", "1 if the last broker poll succeeded")
        up.add_metric([], 1)
        n_brokers = GaugeMetricFamily("kafka_brokers", "Number of brokers in the cluster")
        n_brokers.add_metric([], brokers)
        n_partitions = GaugeMetricFamily("kafka_topic_partitions", "Partitions of the topic", labels=["topic"])
        current = GaugeMetricFamily(
            "kafka_topic_partition_current_offset", "End offset of a partition", labels=["topic", "partition"]
        )
        for topic in self.topics:
            n_partitions.add_metric([topic], sum(1 for tp in ends if tp.topic == topic))
        for tp, end in sorted(ends.items()):
            current.add_metric([tp.topic, str(tp.partition)], end)

        group_labels = ["consumergroup", "topic", "partition"]
        group_offset = GaugeMetricFamily(
            "kafka_consumergroup_current_offset",
            "Next offset the sink will write: Delta-recorded last offset + 1",
            labels=group_labels,
        )
        lag = GaugeMetricFamily("kafka_consumergroup_lag", "End offset - sink offset", labels=group_labels)
        lag_sum = GaugeMetricFamily(
            "kafka_consumergroup_lag_sum", "Lag summed over partitions", labels=["consumergroup", "topic"]
        )
        for sink, topic in self.sinks.items():
            total = 0
            for tp in (tp for tp in ends if tp.topic == topic):
                next_offset = self._delta_offset(sink, topic, tp.partition) + 1
                behind = max(0, ends[tp] - next_offset)
                group_offset.add_metric([sink, topic, str(tp.partition)], next_offset)
                lag.add_metric([sink, topic, str(tp.partition)], behind)
                total += behind
            lag_sum.add_metric([sink, topic], total)
        return [up, n_brokers, n_partitions, current, group_offset, lag, lag_sum, *self._model_families(ends)]

    def _delta_offset(self, sink: str, topic: str, partition: int) -> int:
        """Last offset the sink recorded in Delta for this partition, -1 if none."""
        from deltalake.exceptions import TableNotFoundError

        from lake.tables import open_table, table_uri
        from processors.delta_sink import app_id

        dt = self._tables.get(sink)
        try:
            if dt is None:
                dt = self._tables[sink] = open_table(table_uri(self.settings.tables_dir, sink))
            else:
                dt.update_incremental()
        except TableNotFoundError:
            return -1
        version = dt.transaction_version(app_id(sink, topic, partition))
        return -1 if version is None else version

    def _model_families(self, ends: dict) -> list:
        """The newest ModelVersionEvent (last record of the compacted topic): version in use, age, eval."""
        from kafka import TopicPartition

        from schemas import EventDecodeError, ModelVersionEvent, decode_event

        tp = TopicPartition(self.model_versions_topic, 0)
        end = ends.get(tp, 0)
        if end > 0 and (self._latest_model is None or self._latest_model[0] != end - 1):
            consumer = self._consumer
            consumer.assign([tp])
            consumer.seek(tp, end - 1)
            deadline = time.monotonic() + 5  # the first fetch after an assign can come back empty
            while time.monotonic() < deadline and (self._latest_model is None or self._latest_model[0] < end - 1):
                for record in consumer.poll(timeout_ms=500).get(tp, []):
                    with contextlib.suppress(EventDecodeError):
                        self._latest_model = (record.offset, decode_event(record.value, expect=ModelVersionEvent))
        info = GaugeMetricFamily(
            "flywheel_model_version_latest_info",
            "Newest published model version (value 1)",
            labels=["version", "channel"],
        )
        published = GaugeMetricFamily(
            "flywheel_model_version_latest_timestamp_seconds", "When the newest model version was published"
        )
        evals = GaugeMetricFamily(
            "flywheel_model_version_eval_success_ratio",
            "Eval success rate recorded in the newest model version's event",
            labels=["task", "model_version"],
        )
        if self._latest_model is not None:
            event = self._latest_model[1]
            info.add_metric([event.version, event.channel], 1)
            published.add_metric([], event.produced_at)
            for task, rate in sorted(event.eval.items()):
                evals.add_metric([task, event.version], rate)
        return [info, published, evals]
