"""PNG pictures of a demo run, written next to report.json.

* success.png: success rate per task, one bar per turn (labelled with the model version the fleet ran),
  each bar annotated with its episode count.
* versions.png (continuous runs): the fleet's success over time, a rolling mean over its episodes coloured by
  the version that ran them, and each version's mean drawn across its stretch, labelled with its stage.
* pipeline.png: over the run, steps produced at the edge vs rows landed in Delta per second, the
  end-to-end lag of every step (produced -> row written), both from the Delta `steps` table, and the
  consumer lag per sink in records from Prometheus (when the demo ran one).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

from core.object_store import Location

log = logging.getLogger(__name__)


# query_range(promql, start, end, step_s) -> Prometheus' range result (flywheel.admin.observe), None: no Prometheus
QueryRange = Callable[[str, float, float, float], list[dict]]


def write_plots(out: Path, report: dict, tables_dir: Location, query_range: QueryRange | None) -> list[Path]:
    """Write the PNGs; a plot that fails is logged, never fails the demo."""
    import matplotlib

    matplotlib.use("Agg")
    written = []
    first = ("versions.png", _versions) if report.get("mode") == "continuous" else ("success.png", _success)
    for name, draw in (first, ("pipeline.png", _pipeline)):
        path = out / name
        try:
            draw(path, report, tables_dir, query_range)
            written.append(path)
        except Exception as error:  # noqa: BLE001 - pictures are a courtesy
            log.warning("could not draw %s: %s", name, error)
    return written


def _success(path: Path, report: dict, _tables_dir: Location, _query: QueryRange | None) -> None:
    import matplotlib.pyplot as plt

    turns = report["turns"]
    tasks = sorted({task for turn in turns for task in turn["per_task"]})
    width = 0.8 / max(1, len(turns))
    fig, ax = plt.subplots(figsize=(max(6, 1.4 * len(tasks) * max(1, len(turns)) + 2), 4.5), dpi=110)
    colors = plt.get_cmap("tab10")
    for k, turn in enumerate(turns):
        xs, heights, counts = [], [], []
        for i, task in enumerate(tasks):
            entry = turn["per_task"].get(task)
            if entry is None:
                continue
            xs.append(i + (k - (len(turns) - 1) / 2) * width)
            heights.append(entry["success_rate"])
            counts.append(entry["episodes"])
        label = f"turn {turn['turn']}: {turn['model_version']} (mean {turn['success_rate']:.2f})"
        bars = ax.bar(xs, heights, width * 0.92, label=label, color=colors(k % 10))
        for bar, rate, n in zip(bars, heights, counts, strict=True):
            ax.annotate(
                f"{rate:.2f}\nn={n}",
                (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                xytext=(0, 2),
                textcoords="offset points",
                ha="center",
                va="bottom",
                fontsize=8,
            )
    ax.set_xticks(range(len(tasks)), tasks, rotation=20, ha="right")
    ax.set_ylim(0, 1.3)
    ax.set_yticks([0, 0.25, 0.5, 0.75, 1.0])
    ax.set_ylabel("success rate (binary reward)")
    ax.set_title("Success per task per turn (n = episodes in Delta)")
    ax.legend(loc="upper right", fontsize=8)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def _versions(path: Path, report: dict, tables_dir: Location, _query: QueryRange | None) -> None:
    """The fleet's success by version over time: the demonstrated tasks above, the new tasks (nobody demonstrated)
    below, each version's mean a bar over the time it ran."""
    import matplotlib.pyplot as plt
    import polars as pl

    from lake.tables import EPISODES, scan, table_uri

    episodes = (
        scan(table_uri(tables_dir, EPISODES))
        .filter(pl.col("client_id").str.starts_with(report["fleet_prefix"]))
        .select("produced_at", "model_version", "success", "task")
        .sort("produced_at")
        .collect()
    )
    t0 = (report.get("observability") or {}).get("start") or float(episodes["produced_at"].min())
    new_tasks = list((report.get("new_tasks") or {}).get("tasks", []))
    panels = [("demonstrated tasks", ~pl.col("task").is_in(new_tasks))]
    if new_tasks:
        panels.append(("new tasks: nobody demonstrated, only the verified ending", pl.col("task").is_in(new_tasks)))
    fig, axes = plt.subplots(len(panels), 1, figsize=(13, 4.2 * len(panels)), dpi=110, squeeze=False)
    for ax, (title, chosen) in zip(axes[:, 0], panels, strict=True):
        _versions_panel(ax, episodes.filter(chosen), report, t0, title)
    axes[-1, 0].set_xlabel("seconds since the demo started (dotted: a version published)")
    fig.suptitle(f"Success by version over time; fleet idle {report['fleet_idle_s']} s of {report['run_s']} s")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def _versions_panel(ax, episodes, report: dict, t0: float, title: str) -> None:
    import matplotlib.pyplot as plt
    import numpy as np
    import polars as pl

    stage = {v["model_version"]: v["stage"] for v in report["versions"]} | {"expert": "experts"}
    colors = plt.get_cmap("tab10")
    order = list(dict.fromkeys(episodes["model_version"].to_list()))
    models = episodes.filter(pl.col("model_version") != "expert")
    if models.height >= 10:  # the trend across versions: one rolling mean over every model episode
        window = min(60, models.height // 3)
        trend = np.convolve(models["success"].cast(pl.Float64).to_numpy(), np.ones(window) / window, mode="valid")
        ts = models["produced_at"].to_numpy()[window - 1 :] - t0
        ax.plot(ts, trend, color="black", lw=2, label=f"every model episode, rolling mean of {window}")
    for k, version in enumerate(order):
        mine = episodes.filter(pl.col("model_version") == version)
        ts = mine["produced_at"].to_numpy() - t0
        wins = mine["success"].cast(pl.Float64).to_numpy()
        window = max(1, min(40, len(wins) // 3))
        rolling = np.convolve(wins, np.ones(window) / window, mode="valid")
        color = colors(k % 10)
        ax.plot(ts[window - 1 :], rolling, color=color, lw=1, alpha=0.6)
        ax.hlines(wins.mean(), ts[0], ts[-1], color=color, lw=3,
                  label=f"{version} ({stage.get(version, '?')}): {wins.mean():.2f}, n={len(wins)}")  # fmt: skip
    for v in report["versions"]:
        ax.axvline(v["published_at"] - t0, color="grey", ls=":", lw=1)
    ax.set_ylim(-0.02, 1.05)
    ax.set_ylabel("fleet success (sampled)")
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax.grid(alpha=0.3)


def _pipeline(path: Path, report: dict, tables_dir: Location, query_range: QueryRange | None) -> None:
    import matplotlib.pyplot as plt
    import numpy as np

    from lake.tables import STEPS, scan, table_uri

    obs = report.get("observability") or {}
    steps = scan(table_uri(tables_dir, STEPS)).select("produced_at", "ingested_at").collect()
    t0 = obs.get("start") or float(steps["produced_at"].min())
    produced = steps["produced_at"].to_numpy() - t0
    landed = steps["ingested_at"].to_numpy() - t0
    end = max(float(landed.max()), (obs.get("end") or 0) - t0)

    fig, (ax_rate, ax_e2e, ax_lag) = plt.subplots(3, 1, figsize=(9, 8), dpi=110, sharex=True)
    bins = np.arange(0, end + 2, 2.0)  # 2 s bins
    for values, label in ((produced, "steps produced at the edge"), (landed, "rows landed in Delta `steps`")):
        counts, _ = np.histogram(values, bins)
        ax_rate.step(bins[:-1], counts / 2.0, where="post", label=label)
    ax_rate.set_ylabel("steps / s")
    ax_rate.set_title(f"Pipeline over the run ({len(steps)} steps)")
    ax_rate.legend(fontsize=8)

    lag = landed - produced
    ax_e2e.scatter(produced, lag, s=6, alpha=0.5, label="one step")
    which = np.digitize(produced, bins) - 1  # per 2 s bin: median; empty bins break the line (NaN)
    medians = [float(np.median(lag[which == b])) if np.any(which == b) else np.nan for b in range(len(bins) - 1)]
    ax_e2e.plot(bins[:-1] + 1.0, medians, color="black", lw=1, marker=".", label="median per 2 s")
    ax_e2e.set_ylabel("produced -> in Delta (s)")
    ax_e2e.legend(fontsize=8)

    drawn = False
    if query_range:
        series = query_range(
            "max by (consumergroup) (consumergroup_topic:kafka_consumergroup_lag:sum)",
            t0,
            t0 + end,
            1.0,
        )
        for k, entry in enumerate(series):
            ts = np.array([float(t) for t, _ in entry["values"]]) - t0
            vs = np.array([float(v) for _, v in entry["values"]])
            style = ("-", "--", ":")[k % 3]  # sinks reading the same topic overlap: tell them apart
            ax_lag.plot(ts, vs, style, lw=1.5, label=f"sink {entry['metric'].get('consumergroup', '?')}")
            drawn = True
    if drawn:
        ax_lag.legend(fontsize=8)
        ax_lag.set_ylabel("consumer lag (records)")
    else:
        ax_lag.text(0.5, 0.5, "consumer lag: no Prometheus data for this run", ha="center", va="center",
                    transform=ax_lag.transAxes)  # fmt: skip
    ax_lag.set_xlabel("seconds since the demo started")
    for ax in (ax_rate, ax_e2e, ax_lag):
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
