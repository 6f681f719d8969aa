"""What a chaos run reads from its tables beside the ledger (episodes closed, the fleet's longest idle gap) and its
timeline figure."""

from __future__ import annotations

from pathlib import Path

import polars as pl

from core.object_store import Location
from lake.queries import scan_table
from lake.tables import STEPS


def fleet_idle(tables_dir: Location, prefix: str) -> dict:
    """The fleet's longest gap with no client acting, from the steps its clients (ids starting with `prefix`)
    landed (each episode's first to last step)."""
    steps = scan_table(tables_dir, STEPS)
    if steps is None:
        return {"longest_idle_s": None}
    spans = (steps.filter(pl.col("client_id").str.starts_with(prefix)).group_by("episode_id")
             .agg(pl.col("produced_at").min().alias("a"), pl.col("produced_at").max().alias("b"))
             .sort("a").collect())  # fmt: skip
    longest, reach = 0.0, None
    for a, b in zip(spans["a"], spans["b"], strict=True):
        if reach is not None and a > reach:
            longest = max(longest, a - reach)
        reach = b if reach is None else max(reach, b)
    return {"longest_idle_s": round(longest, 1), "episodes": len(spans)}


def plot_timeline(path: Path, report: dict) -> None:
    """Each strike as a bar from its time to its recovery (red: not recovered), versions published as ticks."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    faults = sorted({f["fault"] for f in report["faults"]})
    fig, ax = plt.subplots(figsize=(12, 1.2 + 0.5 * len(faults)), dpi=110)
    for f in report["faults"]:
        y, width = faults.index(f["fault"]), f["recovered_after_s"]
        ax.barh(y, width if width is not None else 30, left=f["at_s"], height=0.5,
                color="tab:green" if width is not None else "tab:red")  # fmt: skip
    for t in report["published_at_s"]:
        ax.axvline(t, color="tab:blue", alpha=0.3, lw=1)
    ax.set_yticks(range(len(faults)), faults)
    ax.set_xlabel("seconds into the run (bars: strike to recovery; blue lines: versions published)")
    ax.set_title(f"chaos: ledger {'ok' if report['ledger_ok'] else 'FAILED'}, longest fleet idle "
                 f"{report['fleet']['longest_idle_s']} s")  # fmt: skip
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
