"""The soak's figures from its samples (flywheel.soak.run): each process's memory slope and descriptors, files per
table, the learner's read time and the fleet's pace at the end against the start, and where the disk went.

Memory is fitted on each window's minimum: compaction, a training step or a browser's page load lifts RSS for a
moment, and a leak shows in the floor the process returns to, not in its peaks.
"""

from __future__ import annotations

from pathlib import Path
from statistics import median

import numpy as np

WINDOW_S = 300.0  # the memory floor and the descriptors are read per 5-minute window
TARGETS = {"rss_slope_mib_per_h": 5.0, "files_per_table": 200, "read_time_ratio": 1.5, "pace_ratio": 0.9}


def slope_per_h(times_s: list[float], values: list[float]) -> float | None:
    """Least-squares slope of `values` per hour; None with fewer than three points."""
    if len(times_s) < 3:
        return None
    return float(np.polyfit(np.asarray(times_s) / 3600.0, np.asarray(values, float), 1)[0])


def window_floors(times_s: list[float], values: list[float], window_s: float = WINDOW_S) -> tuple[list, list]:
    """(window mid-times, each window's minimum) of a series, windows of `window_s` from its first sample. A last
    window with under half the samples of the fullest is dropped: the least of one or two samples sits high, and
    at the end of a fit it would weigh most."""
    floors: dict[int, float] = {}
    counts: dict[int, int] = {}
    for t, v in zip(times_s, values, strict=True):
        k = int((t - times_s[0]) // window_s)
        floors[k] = min(v, floors.get(k, v))
        counts[k] = counts.get(k, 0) + 1
    last = max(counts)
    if len(counts) > 1 and 2 * counts[last] < max(counts.values()):
        del floors[last]
    return [times_s[0] + (k + 0.5) * window_s for k in floors], list(floors.values())


def process_figures(samples: list[dict], warmup_s: float, window_s: float = WINDOW_S) -> dict[str, dict]:
    """Per process, after the warm-up: the RSS floor's slope (MiB/h), its first and last floor, the descriptors'
    range and whether they end no higher than they started (the last window's least at most the first's most).
    A resumed soak's parts start fresh processes: each part is fitted after its own warm-up, and the longest part's
    figures stand for the process (`parts_slopes` has every part's slope)."""
    names = sorted({n for s in samples for n, v in s["processes"].items() if v})
    figures = {}
    for name in names:
        by_part: dict[int, list] = {}
        for s in samples:
            if s["processes"].get(name):
                by_part.setdefault(s.get("part", 1), []).append((s["t_s"], s["processes"][name]))
        fitted = {part: part_figures(rows, warmup_s, window_s) for part, rows in sorted(by_part.items())}
        fitted = {part: f for part, f in fitted.items() if f is not None}
        if fitted:
            longest = max(fitted.values(), key=lambda f: f["samples"])
            figures[name] = longest | {"parts_slopes": [f["rss_slope_mib_per_h"] for f in fitted.values()]}
    return figures


def part_figures(rows: list[tuple[float, dict]], warmup_s: float, window_s: float) -> dict | None:
    """One process over one part: its samples `warmup_s` after the part's first (the first part starts at 0)."""
    start = 0.0 if rows[0][0] <= warmup_s else rows[0][0]
    rows = [(t, p) for t, p in rows if t >= start + warmup_s]
    if not rows:
        return None
    times = [t for t, _ in rows]
    mids, floors = window_floors(times, [p["rss_mib"] for _, p in rows], window_s)
    fds = [p["fds"] for _, p in rows]
    first_fds = [f for t, f in zip(times, fds, strict=True) if t < times[0] + window_s]
    last_fds = [f for t, f in zip(times, fds, strict=True) if t > times[-1] - window_s]
    slope = slope_per_h(mids, floors)
    return {"rss_slope_mib_per_h": None if slope is None else round(slope, 2), "samples": len(rows),
            "rss_floor_first_mib": round(floors[0], 1), "rss_floor_last_mib": round(floors[-1], 1),
            "rss_max_mib": round(max(p["rss_mib"] for _, p in rows), 1),
            "fds_min": min(fds), "fds_max": max(fds), "fds_flat": min(last_fds) <= max(first_fds),
            "threads_max": max(p["threads"] for _, p in rows)}  # fmt: skip


def at_start_and_end(samples: list[dict], key: str, warmup_s: float) -> tuple[float | None, float | None]:
    """The median of `key` over the window after the warm-up, and over the last window."""
    rows = [(s["t_s"], s[key]) for s in samples if s.get(key) is not None and s["t_s"] >= warmup_s]
    if not rows:
        return None, None
    start = [v for t, v in rows if t < rows[0][0] + WINDOW_S]
    end = [v for t, v in rows if t > rows[-1][0] - WINDOW_S]
    return median(start), median(end)


def disk_figures(samples: list[dict], warmup_s: float) -> dict[str, dict]:
    """Bytes of each table and each other place at the warm-up's end and at the end, and the growth per hour."""
    after = [s for s in samples if s["t_s"] >= warmup_s] or samples
    first, last = after[0], after[-1]
    hours = max(1e-9, (last["t_s"] - first["t_s"]) / 3600)

    def row(before: int, now: int) -> dict:
        return {"first_bytes": before, "last_bytes": now, "growth_mib_per_h": round((now - before) / 2**20 / hours, 2)}

    found = {
        f"table:{t}": row(first["tables"].get(t, {}).get("bytes", 0), v["bytes"]) for t, v in last["tables"].items()
    }
    found |= {place: row(first["disk"].get(place, 0), n) for place, n in last["disk"].items()}
    steps = last["steps"] - first["steps"]
    found["steps_landed"] = {"first": first["steps"], "last": last["steps"], "per_h": round(steps / hours)}
    return found


def soak_report(samples: list[dict], books: dict, warmup_s: float) -> dict:
    processes = process_figures(samples, warmup_s)
    # The table's own files, what a reader lists; files it no longer names wait on disk for vacuum's retention.
    files = {t: max(s["tables"][t]["live_files"] for s in samples if t in s["tables"])
             for t in {t for s in samples for t in s["tables"]}}  # fmt: skip
    on_disk = {t: max(s["tables"][t]["files_on_disk"] for s in samples if t in s["tables"]) for t in files}
    read_start, read_end = at_start_and_end(samples, "learner_read_s", warmup_s)
    pace_start, pace_end = at_start_and_end(samples, "steps_per_s", warmup_s)
    slopes = {n: p["rss_slope_mib_per_h"] for n, p in processes.items()}
    targets = {
        "ledger_ok": bool(books.get("ok")),
        # None: too short to fit (fewer than three windows after the warm-up)
        "rss_slope_mib_per_h<=5": None
        if None in slopes.values() or not slopes
        else all(v <= TARGETS["rss_slope_mib_per_h"] for v in slopes.values()),
        "fds_flat": all(p["fds_flat"] for p in processes.values()),
        "files_per_table<=200": all(n <= TARGETS["files_per_table"] for n in files.values()),
        "read_time_end<=1.5x_start": None if not read_start else read_end <= TARGETS["read_time_ratio"] * read_start,
        "steps_per_s_end>=0.9x_start": None if not pace_start else pace_end >= TARGETS["pace_ratio"] * pace_start,
    }
    return {
        "hours": round(samples[-1]["t_s"] / 3600, 3) if samples else 0.0, "samples": len(samples),
        "warmup_s": warmup_s, "targets": targets, "processes": processes,
        "max_files": files, "max_files_on_disk": on_disk,
        "learner_read_s": {"start": read_start, "end": read_end},
        "steps_per_s": {"start": pace_start, "end": pace_end},
        "disk": disk_figures(samples, warmup_s) if samples else {}, "books": books,
        "versions": samples[-1]["versions"] if samples else 0,
    }  # fmt: skip


def plot_soak(path: Path, samples: list[dict]) -> None:
    """One panel per kind of series against the run's hours."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    hours = [s["t_s"] / 3600 for s in samples]
    names = sorted({n for s in samples for n, v in s["processes"].items() if v})
    tables = sorted({t for s in samples for t in s["tables"]})
    places = sorted({p for s in samples for p in s["disk"]})
    fig, axes = plt.subplots(3, 2, figsize=(13, 11), sharex=True)

    def series(ax, label, values):
        ax.plot([h for h, v in zip(hours, values, strict=True) if v is not None], [v for v in values if v is not None],
                label=label, lw=1)  # fmt: skip

    for name in names:
        series(axes[0, 0], name, [(s["processes"].get(name) or {}).get("rss_mib") for s in samples])
        series(axes[0, 1], name, [(s["processes"].get(name) or {}).get("fds") for s in samples])
    for table in tables:
        series(axes[1, 0], table, [s["tables"].get(table, {}).get("files_on_disk") for s in samples])
    for place in [f"table:{t}" for t in tables] + places:
        values = [(s["tables"].get(place[6:], {}).get("bytes") if place.startswith("table:") else s["disk"].get(place))
                  for s in samples]  # fmt: skip
        series(axes[1, 1], place, [None if v is None else v / 2**20 for v in values])
    series(axes[2, 0], "steps / s", [s["steps_per_s"] for s in samples])
    series(axes[2, 0], "consumer lag", [sum(s["lag"].values()) if s["lag"] else None for s in samples])
    series(axes[2, 1], "learner read s", [s["learner_read_s"] for s in samples])
    titles = ["RSS (MiB)", "open descriptors", "parquet files on disk per table", "MiB on disk",
              "fleet steps/s and consumer lag (events)", "the learner's poll read (s)"]  # fmt: skip
    for ax, title in zip(axes.flat, titles, strict=True):
        ax.set_title(title, fontsize=10)
        ax.legend(fontsize=6, ncol=2)
        ax.grid(alpha=0.3)
    for ax in axes[2]:
        ax.set_xlabel("hours")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
