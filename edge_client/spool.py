"""Write-ahead spool of an edge client: every event goes to local disk first, and a background
thread sends the spool to Kafka in order. While Kafka is unreachable the client keeps acting and
the spool grows (bounded); when Kafka is back the drain catches up, oldest first.

File format of `spool.log`: records of [u32 topic length][u32 key length][u32 value length]
[topic][key][value]. `cursor` holds the byte offset of the first record not yet acknowledged by
Kafka. When the drain reaches the end, both are reset, so the file stays small in normal operation.
A client killed after Kafka acknowledged records but before the cursor says so sends them again on its
next run: the log then holds them twice, and the sinks keep one row per event_id (processors.dedup).

Each client has its own spool, `$FLYWHEEL_HOME/spool/<client id>` (`spool_dir`), and whatever an earlier run left
in it (killed, or stopped before Kafka took everything) is sent first by whoever opens it next: the client's next
run, or `flywheel spool replay` for a client that never returns. The records are sent as they were spooled, so each
event keeps its event_id. One process at a time: `hold` takes an flock while a Spool is open, so a second run of
the client, or the replay command, is refused instead of sending the same records alongside it; the kernel
drops the lock when its holder dies, even by SIGKILL, so no stale lock outlives a crash.
"""

from __future__ import annotations

import fcntl
import logging
import os
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from kafka.errors import KafkaError

log = logging.getLogger(__name__)
HEADER = struct.Struct(">III")


class SpoolFull(RuntimeError):
    """The spool reached its bound: the client must stop acting; nothing spooled is dropped."""


class SpoolInUse(RuntimeError):
    """Another live process holds this spool: a run of the same client, or `flywheel spool replay`."""


def spool_dir(home: Path, client_id: str) -> Path:
    """The spool of client `client_id` under FLYWHEEL_HOME `home`: where each run of that client, and the replay
    command, find what is owed to Kafka."""
    if not client_id or client_id in (".", "..") or "/" in client_id or "\0" in client_id:
        raise ValueError(f"client id {client_id!r} cannot name a spool directory")
    return home / "spool" / client_id


@dataclass(frozen=True)
class SpooledRecord:
    end: int  # byte offset just after this record
    topic: str
    key: bytes
    value: bytes


SPOOL_MAX_BYTES = 256 * 1024 * 1024  # a client's default bound (EdgeConfig.spool_max_bytes)


class Spool:
    def __init__(self, directory: Path, max_bytes: int = SPOOL_MAX_BYTES):
        self.directory = directory
        self.max_bytes = max_bytes
        directory.mkdir(parents=True, exist_ok=True)
        self._held = hold(directory / "lock")  # before recovery: only the holder may repair or send the log
        self.log_path = directory / "spool.log"
        self.cursor_path = directory / "cursor"
        self.lock = threading.Lock()
        self.cursor = int(self.cursor_path.read_text()) if self.cursor_path.exists() else 0
        self._recover()
        self._writer = open(self.log_path, "ab")
        self.pending_records = sum(1 for _ in self._read(self.cursor, None))  # left by an earlier run
        if self.pending_records:  # that run died, or stopped before Kafka took everything: they go out first
            log.warning("%d events left in %s by an earlier run; sending them first", self.pending_records, directory)

    def _recover(self) -> None:
        """Repair what a crash can leave: a cursor past the end (killed between truncating the log and
        resetting the cursor) and a half-written last record (killed mid-append)."""
        if not self.log_path.exists():
            self.log_path.touch()
        size = self.log_path.stat().st_size
        if self.cursor > size:
            self.cursor = 0
            self.cursor_path.write_text("0")
        complete = self.cursor
        for record in self._read(self.cursor, None):
            complete = record.end
        with open(self.log_path, "r+b") as log_file:
            log_file.truncate(complete)

    def size(self) -> int:
        return self._writer.tell()

    def append(self, topic: str, key: bytes, value: bytes) -> None:
        encoded = topic.encode()
        record = HEADER.pack(len(encoded), len(key), len(value)) + encoded + key + value
        with self.lock:
            if self.size() - self.cursor + len(record) > self.max_bytes:
                raise SpoolFull(
                    f"edge spool {self.directory} holds {self.size() - self.cursor} unsent bytes and the next event "
                    f"needs {len(record)}; bound is {self.max_bytes} (--spool-max-bytes). Kafka has been "
                    f"unreachable too long; the {self.pending_records} spooled events are kept and sent on restart."
                )
            self._writer.write(record)
            self._writer.flush()  # in the OS page cache: survives the process, not a power cut
            self.pending_records += 1

    def pending(self, limit: int) -> list[SpooledRecord]:
        with self.lock:
            end = self.size()
        return list(self._read(self.cursor, limit, end))

    def advance(self, offset: int, records: int) -> None:
        """Everything before `offset` is acknowledged by Kafka."""
        with self.lock:
            if self._writer.closed:  # a send that outlived close: the lock is gone, the next holder sends them again
                return
            self.pending_records -= records
            if offset >= self.size():  # drained: start the file afresh
                self._writer.truncate(0)
                self._writer.seek(0)
                offset = 0
            self.cursor = offset
            tmp = self.cursor_path.with_suffix(".tmp")
            tmp.write_text(str(offset))
            os.replace(tmp, self.cursor_path)

    def _read(self, start: int, limit: int | None, end: int | None = None):
        with open(self.log_path, "rb") as reader:
            reader.seek(start)
            count = 0
            while limit is None or count < limit:
                header = reader.read(HEADER.size)
                if len(header) < HEADER.size:
                    return
                topic_len, key_len, value_len = HEADER.unpack(header)
                body = reader.read(topic_len + key_len + value_len)
                if len(body) < topic_len + key_len + value_len or (end is not None and reader.tell() > end):
                    return  # a record still being written
                topic = body[:topic_len].decode()
                yield SpooledRecord(
                    reader.tell(), topic, body[topic_len : topic_len + key_len], body[topic_len + key_len :]
                )
                count += 1

    def close(self) -> None:
        with self.lock:
            self._writer.close()
            self._held.close()  # releases the flock: the next run of this client, or the replay command, may open it


def hold(path: Path) -> TextIO:
    """An exclusive flock on `path`, held while the returned file is open; SpoolInUse naming the holder's pid when
    another process has it. flock, not a pid file alone: the kernel releases it when the holder dies, and a second
    open in one process conflicts too."""
    handle = open(path, "a+")  # noqa: SIM115 (held for the spool's life)
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.seek(0)
        holder = handle.read().strip() or "unknown"
        handle.close()
        raise SpoolInUse(
            f"edge spool {path.parent} is in use by process {holder} (a run of this client, or `flywheel spool "
            "replay`); stop it first, or let it send the spool itself"
        ) from None
    handle.truncate(0)
    handle.write(f"{os.getpid()}\n")
    handle.flush()
    return handle


class SpoolingPublisher:
    """`publish` never blocks on Kafka: it appends to the spool and wakes the drain thread."""

    def __init__(
        self,
        spool: Spool,
        make_producer: Callable[[], object],
        on_delivered: Callable[[SpooledRecord], None] = lambda record: None,
        on_acknowledged: Callable[[list[SpooledRecord]], None] = lambda records: None,
        batch: int = 200,
        send_timeout_s: float = 5.0,
        max_backoff_s: float = 10.0,
    ):
        self.spool = spool
        self.make_producer = make_producer
        self.on_delivered = on_delivered
        # Between Kafka's acknowledgement and the cursor write: a process that dies here sends these records again
        # on its next run, and the sinks drop the copies by event_id (processors.dedup). Tests kill it here.
        self.on_acknowledged = on_acknowledged
        self.batch = batch
        self.send_timeout_s = send_timeout_s
        self.max_backoff_s = max_backoff_s
        self.online = True
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._producer = None
        self._in_flight: tuple[list[SpooledRecord], list] | None = None  # sent, not yet acknowledged
        self._thread = threading.Thread(target=self._drain_forever, name="spool-drain", daemon=True)
        self._thread.start()

    def publish(self, topic: str, key: bytes, value: bytes) -> None:
        self.spool.append(topic, key, value)
        self._wake.set()

    def depth(self) -> int:
        return self.spool.pending_records

    def close(self, timeout_s: float = 60.0) -> int:
        """Wait up to `timeout_s` for the spool to drain; return how many events are still spooled."""
        deadline = time.monotonic() + timeout_s
        while self.depth() and time.monotonic() < deadline:
            self._wake.set()
            time.sleep(0.05)
        self._stop.set()
        self._wake.set()
        self._thread.join(timeout=self.send_timeout_s + 5)
        if self._producer is not None:
            try:
                self._producer.close(timeout=5)
            except KafkaError as error:  # Kafka still unreachable: what it held is still spooled, sent next run
                log.warning("kafka unreachable at close (%s); %d events stay spooled", type(error).__name__,
                            self.depth())  # fmt: skip
        self.spool.close()
        return self.depth()

    def _drain_forever(self) -> None:
        backoff = 0.5
        while not self._stop.is_set():
            self._wake.wait(timeout=1.0)
            self._wake.clear()
            while self.depth() and not self._stop.is_set():
                if self._send_batch():
                    backoff = 0.5
                    continue
                self._stop.wait(backoff)  # Kafka unreachable: try again later, the client keeps acting
                backoff = min(backoff * 2, self.max_backoff_s)

    def _send_batch(self) -> bool:
        """Send the oldest spooled records, or keep waiting for the ones already sent; True once they
        are acknowledged.

        Records handed to the producer are never sent a second time while the producer still owns them:
        its own retries are idempotent (the broker drops a retried batch it already wrote, even across a
        broker restart), a resend by us would not be. Only records the producer gave up on (delivery
        timeout) are sent again, from the spool.
        """
        try:
            if self._producer is None:
                self._producer = self.make_producer()
            if self._in_flight is None:
                records = self.spool.pending(self.batch)
                if not records:
                    return True
                futures = [self._producer.send(r.topic, key=r.key, value=r.value) for r in records]
                self._in_flight = (records, futures)
            records, futures = self._in_flight
            self._producer.flush(timeout=self.send_timeout_s)
        except (KafkaError, AssertionError) as error:  # unreachable: the producer keeps what it holds
            self._went_offline(error)
            return False
        failed = [future.exception for future in futures if future.failed()]
        self._in_flight = None
        if failed:  # given up by the producer: never written, sent again from the spool next time
            self._went_offline(failed[0])
            return False
        if not self.online:
            log.warning("kafka reachable again; spool drained to %d events", self.depth() - len(records))
        self.online = True
        self.on_acknowledged(records)
        self.spool.advance(records[-1].end, len(records))
        for record in records:
            self.on_delivered(record)
        return True

    def _went_offline(self, error: BaseException) -> None:
        if self.online:
            log.warning("kafka unreachable (%s); spooling to %s", type(error).__name__, self.spool.directory)
        self.online = False
