"""What a soak samples every `sample_s`: each process's resources from /proc, and the data's size on disk.

A sample is one JSON line of DIR/samples.jsonl (flywheel.soak.run); flywheel.soak.report reads them back. The
readers here take pids and paths, nothing of the run, so a test can feed them any process or folder.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

PAGE_MIB = os.sysconf("SC_PAGE_SIZE") / 2**20
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class ProcessStats:
    rss_mib: float  # resident memory
    fds: int  # open file descriptors
    threads: int
    cpu_s: float  # user + system time since the process started

    def __add__(self, other: ProcessStats) -> ProcessStats:  # a process tree counts as one (a client's chromium)
        return ProcessStats(self.rss_mib + other.rss_mib, self.fds + other.fds, self.threads + other.threads,
                            self.cpu_s + other.cpu_s)  # fmt: skip


def parse_stat(text: str) -> tuple[float, int, float]:
    """(cpu seconds, threads, rss MiB) from /proc/<pid>/stat. The command name (field 2) is in parentheses and may
    hold spaces, so fields are counted after its closing one: utime and stime are fields 14-15, num_threads 20,
    rss (pages) 24 (proc(5))."""
    fields = text[text.rindex(")") + 2 :].split()  # fields[0] is field 3
    utime, stime, threads, rss_pages = int(fields[11]), int(fields[12]), int(fields[17]), int(fields[21])
    return (utime + stime) / CLOCK_TICKS, threads, rss_pages * PAGE_MIB


def process_stats(pid: int) -> ProcessStats | None:
    """The process's stats now, or None once it is gone (it may exit between listing and reading)."""
    try:
        cpu_s, threads, rss_mib = parse_stat(Path(f"/proc/{pid}/stat").read_text())
        fds = len(os.listdir(f"/proc/{pid}/fd"))
    except (OSError, ValueError, IndexError):
        return None
    return ProcessStats(round(rss_mib, 2), fds, threads, round(cpu_s, 2))


def tree_stats(pids: list[int]) -> ProcessStats | None:
    """The sum over the processes still alive among `pids`; None when none is."""
    alive = [s for s in map(process_stats, pids) if s is not None]
    return sum(alive[1:], alive[0]) if alive else None


def dir_bytes(path: Path) -> int:
    """Bytes the files under `path` take on disk (0 when it does not exist): allocated blocks, not lengths, as Kafka
    sizes its index files ahead and leaves them sparse. Files removed while walking are skipped."""
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            try:
                total += os.stat(os.path.join(root, name), follow_symlinks=False).st_blocks * 512
            except OSError:
                continue
    return total


def file_count(path: Path, suffix: str) -> int:
    """Files under `path` whose name ends with `suffix` (a Delta table's parquet files, live or not yet vacuumed)."""
    return sum(name.endswith(suffix) for _, _, files in os.walk(path) for name in files)
