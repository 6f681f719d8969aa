"""`flywheel status`: one screen about a running (or finished) flywheel.

Kafka (end offsets, the newest model version) and Delta (sink offsets -> lag, success by task and
model version) are read directly; live rates and latencies come from Prometheus when it answers (an instant query
function, flywheel.admin.observe.query bound to its URL, passed in).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from core.object_store import Location
from core.settings import Settings

Query = Callable[[str], list[dict]]  # PromQL -> the instant result's list; raises OSError when no one answers


def render_status(settings: Settings, prometheus_url: str | None = None, query: Query | None = None) -> str:
    """The screen; the live rates from `query` (Prometheus at `prometheus_url`) when both are given."""
    lines = [
        f"flywheel status  {time.strftime('%Y-%m-%d %H:%M:%S')}  prefix {settings.topic_prefix}  "
        f"kafka {settings.bootstrap}  data {settings.data_dir}"
    ]
    kafka = _kafka(settings)
    live = _live(query) if prometheus_url and query else None

    lines.append("")
    lines.append("FLEET")
    if live is None:
        lines.append(f"  (prometheus {prometheus_url} unreachable: live rates omitted)")
    else:
        versions = ", ".join(f"{v} x{n:g}" for v, n in live["versions_in_use"]) or "none running"
        lines.append(f"  edge clients up {live['clients_up']:g}   running {versions}")
        lines.append(f"  episodes/s {live['episodes_rate']:.2f}   steps published/s {live['steps_rate']:.2f}")
        phases = "  ".join(f"{p} {v * 1e3:.0f} ms" for p, v in live["phase_p95"]) or "no steps in the last minute"
        lines.append(f"  step p95: {phases}")

    lines.append("")
    lines.append("PIPELINE")
    if "error" in kafka:
        lines.append(f"  kafka unreachable: {kafka['error']}")
    else:
        ends = ", ".join(f"{topic.removeprefix(settings.topic_prefix + '.')} {n}" for topic, n in kafka["ends"].items())
        lines.append(f"  brokers {kafka['brokers']}   topic end offsets: {ends}")
        lines.append("  lag (records not yet in Delta): " + ", ".join(f"{s} {n}" for s, n in kafka["lag"].items()))
    if live is not None:
        lines.append(
            f"  events/s {live['events_rate']:.2f}   rows/s into Delta {live['rows_rate']:.2f}   "
            f"dead letters {live['dead_letters']:g}   produced->Delta p95 {_fmt_s(live['e2e_p95'])}"
        )

    lines.append("")
    lines.append("LEARNER")
    latest = kafka.get("latest")
    if latest is None:
        lines.append("  no model version published yet")
    else:
        age = time.time() - latest.produced_at
        lines.append(
            f"  current version {latest.version} ({latest.stage}, channel {latest.channel}, parent "
            f"{latest.parent or '-'}), published {_fmt_s(age)} ago; {kafka['versions_published']} versions so far"
        )
    if live is not None and live["learner"]:
        lines.append("  training now: " + live["learner"])

    lines.append("")
    lines.append("SUCCESS BY TASK AND MODEL VERSION (Delta `episodes`; rate and episode count, oldest version first)")
    lines.extend(_success_table(settings.tables_dir))
    return "\n".join(lines)


def _kafka(settings: Settings) -> dict:
    from processors.lag import LagExporter

    exporter = LagExporter(settings)
    try:
        families = {f.name: f for f in exporter.poll()}
    except Exception as error:  # noqa: BLE001 - status shows what it can
        return {"error": str(error)}
    finally:
        exporter.stop()
    ends: dict[str, int] = {}
    for sample in families["kafka_topic_partition_current_offset"].samples:
        ends[sample.labels["topic"]] = ends.get(sample.labels["topic"], 0) + int(sample.value)
    lag = {s.labels["consumergroup"]: int(s.value) for s in families["kafka_consumergroup_lag_sum"].samples}
    latest = exporter._latest_model[1] if exporter._latest_model else None
    return {
        "brokers": int(families["kafka_brokers"].samples[0].value),
        "ends": ends,
        "lag": lag,
        "latest": latest,
        "versions_published": ends.get(exporter.model_versions_topic, 0),
    }


def _live(query: Query) -> dict | None:
    def scalar(expr: str) -> float:
        result = query(expr)
        return float(result[0]["value"][1]) if result else 0.0

    try:
        clients_up = scalar('count(up{job="flywheel-edge"} == 1)')
    except OSError:
        return None
    versions = query("count by (version) (flywheel_edge_model_version_info == 1)")
    phases = query("phase:flywheel_edge_step_phase_seconds:p95_5m")
    learner = query("flywheel_learner_loss")
    return {
        "clients_up": clients_up,
        "versions_in_use": sorted((r["metric"]["version"], float(r["value"][1])) for r in versions),
        "episodes_rate": scalar("sum(rate(flywheel_edge_episodes_total[1m]))"),
        "steps_rate": scalar("sum(rate(flywheel_edge_steps_published_total[1m]))"),
        "phase_p95": sorted((r["metric"]["phase"], float(r["value"][1])) for r in phases if r["value"][1] != "NaN"),
        "events_rate": scalar("flywheel:processor_events:rate1m"),
        "rows_rate": scalar("sum(table:flywheel_delta_rows:rate1m)"),
        "dead_letters": scalar("sum(flywheel_dead_letters_total)"),
        "e2e_p95": scalar("flywheel:pipeline_end_to_end_seconds:p95_5m"),
        "learner": ", ".join(f"{r['metric'].get('stage', '?')} loss {float(r['value'][1]):.3f}" for r in learner),
    }


def _success_table(tables_dir: Location) -> list[str]:
    import polars as pl

    from lake.tables import EPISODES, scan, table_exists, table_uri

    uri = table_uri(tables_dir, EPISODES)
    if not table_exists(uri):
        return ["  no episodes in Delta yet"]
    frame = (
        scan(uri)
        .group_by("task", "model_version")
        .agg(
            pl.len().alias("n"),
            pl.col("success").cast(pl.Float64).mean().alias("rate"),
            pl.col("produced_at").min().alias("first"),
        )  # fmt: skip
        .collect()
    )
    versions = (frame.group_by("model_version").agg(pl.col("first").min()).sort("first")["model_version"].to_list())[
        -5:
    ]  # the five newest versions fit on a screen
    tasks = sorted(frame["task"].unique().to_list())
    cells = {(r["task"], r["model_version"]): f"{r['rate']:.2f} ({r['n']})" for r in frame.iter_rows(named=True)}
    width = max(12, *(len(v) + 2 for v in versions))
    lines = ["  " + f"{'task':24s}" + "".join(f"{v:>{width}s}" for v in versions)]
    for task in tasks:
        lines.append("  " + f"{task:24s}" + "".join(f"{cells.get((task, v), '-'):>{width}s}" for v in versions))
    return lines


def _fmt_s(seconds: float) -> str:
    if seconds != seconds:  # NaN: no data
        return "-"
    if seconds < 1:
        return f"{seconds * 1e3:.0f} ms"
    if seconds < 120:
        return f"{seconds:.1f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"
