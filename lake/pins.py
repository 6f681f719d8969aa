"""Table versions a running reader holds: a pin file per process, so Delta maintenance keeps their files.

A learner reads the tables at the versions it pinned for its whole run (its published manifest's lineage
takes over afterwards). The file is `<pins_dir>/<pid>.json` = {table: version}, removed on exit; a pin whose
process is gone (a crash) is ignored, so it never holds files forever.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator, Mapping
from pathlib import Path


@contextlib.contextmanager
def pinned(pins_dir: Path, versions: Mapping[str, int]) -> Iterator[Path]:
    """Pin `versions` for the duration of the block (this process's pin file)."""
    path = Path(pins_dir) / f"{os.getpid()}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(dict(versions)))
    tmp.replace(path)  # atomic: maintenance never reads half a pin
    try:
        yield path
    finally:
        path.unlink(missing_ok=True)


def live_pins(pins_dir: Path) -> list[dict[str, int]]:
    """The pins of processes that still run."""
    pins = []
    for path in sorted(Path(pins_dir).glob("*.json")):
        if not path.stem.isdigit() or not _alive(int(path.stem)):
            continue
        with contextlib.suppress(FileNotFoundError, json.JSONDecodeError):  # removed or replaced meanwhile
            pins.append({str(table): int(version) for table, version in json.loads(path.read_text()).items()})
    return pins


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: it exists
        return True
    return True
