"""Table versions a running reader holds: a pin file per process, so Delta maintenance keeps their files.

A learner reads the tables at the versions it pinned for its whole run (its published manifest's lineage
takes over afterwards). On a local disk the pin is `<pins_dir>/<pid>.json` = {table: version}, removed on exit; a
pin whose process is gone (a crash) is ignored, so it never holds files forever. On the object store the reader
may run on another machine, where no pid can be checked: the pin is a lease, `<host>-<pid>-<random>.json` =
{"versions": {...}, "expires_at": unix time}, removed on exit and ignored once expired (a crashed reader's files
are kept `lease_s` longer, never forever).
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import time
import uuid
from collections.abc import Iterator, Mapping
from pathlib import Path

from core.object_store import Location, is_remote, join

PIN_LEASE_S = 6 * 3600.0  # longer than any training run reads its pinned versions


@contextlib.contextmanager
def pinned(pins_dir: Location, versions: Mapping[str, int], lease_s: float = PIN_LEASE_S) -> Iterator[Location]:
    """Pin `versions` for the duration of the block (this process's pin file)."""
    if is_remote(pins_dir):
        with _leased(pins_dir, versions, lease_s) as location:
            yield location
        return
    path = Path(pins_dir) / f"{os.getpid()}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(dict(versions)))
    tmp.replace(path)  # atomic: maintenance never reads half a pin
    try:
        yield path
    finally:
        path.unlink(missing_ok=True)


def live_pins(pins_dir: Location) -> list[dict[str, int]]:
    """The pins of readers that still run (local), or whose lease has not expired (object store)."""
    if is_remote(pins_dir):
        return _live_leases(pins_dir)
    pins = []
    for path in sorted(Path(pins_dir).glob("*.json")):
        if not path.stem.isdigit() or not _alive(int(path.stem)):
            continue
        with contextlib.suppress(FileNotFoundError, json.JSONDecodeError):  # removed or replaced meanwhile
            pins.append({str(table): int(version) for table, version in json.loads(path.read_text()).items()})
    return pins


@contextlib.contextmanager
def _leased(pins_dir: str, versions: Mapping[str, int], lease_s: float) -> Iterator[Location]:
    from core.settings import get_settings

    files = get_settings().files()
    location = join(pins_dir, f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}.json")
    files.write(location, json.dumps({"versions": dict(versions), "expires_at": time.time() + lease_s}).encode())
    try:
        yield location
    finally:
        files.delete(location)


def _live_leases(pins_dir: str) -> list[dict[str, int]]:
    from core.settings import get_settings

    files, now, pins = get_settings().files(), time.time(), []
    for location in files.list(pins_dir):
        data = files.read(location)
        with contextlib.suppress(json.JSONDecodeError, KeyError, TypeError):
            lease = json.loads(data) if data is not None else None
            if lease and lease["expires_at"] > now:
                pins.append({str(table): int(version) for table, version in lease["versions"].items()})
    return pins


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: it exists
        return True
    return True
