"""`flywheel dlq`: the dead-letter topic, readably. Each dead letter is the original record's bytes with
headers `reason`, `detail`, `source_topic`, `source_partition`, `source_offset` (processors.worker)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from datetime import UTC, datetime

from core.settings import Settings
from processors.replay import assign_from_beginning, read_until
from streams.kafka_clients import make_consumer
from streams.topics import topics_for


@dataclass(frozen=True)
class DeadLetter:
    partition: int
    offset: int
    timestamp: float  # unix seconds, when the worker dead-lettered it
    reason: str
    detail: str
    source_topic: str
    source_partition: int
    source_offset: int
    size: int  # bytes of the original record value
    value: bytes  # the original bytes, untouched

    def as_json(self) -> dict:
        out = asdict(self)
        out["value"] = self.value[:64].hex()  # a prefix is enough to recognise it
        return out


def _header(headers: dict[str, bytes | None], name: str, default: str = "") -> str:
    value = headers.get(name)
    return default if value is None else value.decode(errors="replace")


def _int_header(headers: dict[str, bytes | None], name: str) -> int:
    """A number header, -1 when missing or not a number (the topic may hold what no worker wrote)."""
    try:
        return int(_header(headers, name))
    except ValueError:
        return -1


def read_dead_letters(settings: Settings, limit: int | None = None) -> list[DeadLetter]:
    """The dead letters in the topic now, oldest first; with `limit`, the newest `limit` of them."""
    consumer = make_consumer(settings, "flywheel-dlq", consumer_timeout_ms=1000)
    try:
        horizon = assign_from_beginning(consumer, [topics_for(settings).dead_letters.name])
        letters = []
        for batch in read_until(consumer, horizon, stall_s=30.0):
            for record in batch:
                headers = {k: v for k, v in (record.headers or [])}
                letters.append(
                    DeadLetter(
                        partition=record.partition,
                        offset=record.offset,
                        timestamp=record.timestamp / 1000.0,
                        reason=_header(headers, "reason", "?"),
                        detail=_header(headers, "detail"),
                        source_topic=_header(headers, "source_topic"),
                        source_partition=_int_header(headers, "source_partition"),
                        source_offset=_int_header(headers, "source_offset"),
                        size=len(record.value or b""),
                        value=record.value or b"",
                    )
                )
    finally:
        consumer.close()
    letters.sort(key=lambda d: (d.timestamp, d.partition, d.offset))
    return letters[-limit:] if limit else letters


def format_dead_letters(letters: list[DeadLetter], detail_width: int = 70) -> str:
    header = f"{'offset':>7s}  {'time (UTC)':19s}  {'reason':24s} {'source':28s} {'bytes':>8s}  detail"
    lines = [header, "-" * (len(header) + detail_width - 6)]
    for d in letters:
        when = datetime.fromtimestamp(d.timestamp, UTC).strftime("%Y-%m-%d %H:%M:%S")
        source = f"{d.source_topic.rsplit('.', 1)[-1]}[{d.source_partition}]@{d.source_offset}"
        detail = " ".join(d.detail.removeprefix(f"{d.reason}: ").split())  # the worker's detail repeats the reason
        detail = detail if len(detail) <= detail_width else detail[: detail_width - 1] + "…"
        lines.append(f"{d.offset:7d}  {when:19s}  {d.reason:24s} {source:28s} {d.size:8d}  {detail}")
    lines.append(f"{len(letters)} dead letter(s)")
    return "\n".join(lines)
