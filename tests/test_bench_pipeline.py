"""The pipeline bench's figures over rounds: medians of rates and latencies (a drifting VM's minutes), sums of what
was lost or duplicated, every round kept."""

from __future__ import annotations

from flywheel.bench.pipeline import over_rounds


def run(events_per_s: float, p99: float | None, lost: int = 0) -> dict:
    return {"events": 100, "events_per_s": events_per_s, "e2e_p50_s": 0.3, "e2e_p99_s": p99, "lost": lost,
            "duplicated": 0, "offered_rate": 1000.0, "achieved_rate": 990.0, "mean_event_bytes": 5000}  # fmt: skip


def test_a_slow_round_moves_the_median_not_the_figure():
    runs = [run(6700.0, 0.9), run(3600.0, 0.7, lost=1), run(6400.0, None)]
    figures = over_rounds(runs)
    assert figures["events_per_s"] == 6400.0  # the slow minute is one round of three
    assert figures["e2e_p99_s"] == 0.8  # the round without a latency phase's rows does not count
    assert (figures["events"], figures["lost"], figures["rounds"]) == (300, 1, runs)
