"""The edge benchmark's merging of rounds (the rounds themselves run in test_vla_release)."""

from flywheel.bench.edge import median_figures


def test_rounds_merge_to_medians_and_keep_each_rounds_step_time():
    rounds = [
        {"step_ms_p50": 50.0, "peak_rss_mb": 800.0, "visual_tokens_kept": 84, "generated": [[1, 2]]},
        {"step_ms_p50": 70.0, "peak_rss_mb": 810.0, "visual_tokens_kept": 84, "generated": [[1, 2]]},
        {"step_ms_p50": 55.0, "peak_rss_mb": 790.0, "visual_tokens_kept": 84, "generated": [[1, 2]]},
    ]
    merged = median_figures(rounds)
    assert merged["step_ms_p50"] == 55.0 and merged["peak_rss_mb"] == 800.0
    assert merged["visual_tokens_kept"] == 84 and merged["generated"] == [[1, 2]]
    assert merged["rounds_step_ms_p50"] == [50.0, 70.0, 55.0]
