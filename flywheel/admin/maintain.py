"""`flywheel maintain`: compact, vacuum and checkpoint the Delta tables (processors.maintenance), once or on an
interval, printing each pass's report."""

from __future__ import annotations

import json
import threading

from core.settings import Settings


def run_maintenance(settings: Settings, config, once: bool, interval_s: float, as_json: bool) -> bool:
    """One pass (`once`; False when a table failed) or a pass every interval_s until Ctrl-C (True)."""
    from processors.maintenance import format_report, maintain_every, maintain_tables

    def show(report) -> None:
        print(json.dumps(report.as_json(), indent=2) if as_json else format_report(report), flush=True)

    if once:
        report = maintain_tables(settings, config)
        show(report)
        return report.ok
    try:
        maintain_every(settings, interval_s, threading.Event(), config, on_report=show)
    except KeyboardInterrupt:  # Ctrl-C lands between delta-rs calls, never inside a commit
        pass
    return True
