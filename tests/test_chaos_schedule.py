"""The chaos run's fault schedule: seeded, complete, spaced (flywheel.chaos.schedule)."""

from __future__ import annotations

from collections import Counter

import pytest

from flywheel.chaos.schedule import FAULTS, make_schedule


def test_every_fault_strikes_its_repeats_in_order_spaced_for_recovery():
    schedule = make_schedule(minutes=30, seed=7, repeats=2)
    assert Counter(s.fault for s in schedule) == {fault: 2 for fault in FAULTS}
    times = [s.at_s for s in schedule]
    assert times == sorted(times) and times[0] >= 120 + 20 and times[-1] <= 30 * 60 - 60
    gaps = [b - a for a, b in zip(times, times[1:], strict=False)]
    assert min(gaps) >= 60 + 20  # the one before recovered, this one settled


def test_the_same_seed_gives_the_same_schedule_and_another_seed_another():
    assert make_schedule(30, seed=1) == make_schedule(30, seed=1)
    assert make_schedule(30, seed=1) != make_schedule(30, seed=2)
    assert [s.fault for s in make_schedule(30, seed=1)] != sorted(s.fault for s in make_schedule(30, seed=1))


def test_a_run_too_short_or_an_unknown_fault_is_refused_clearly():
    with pytest.raises(ValueError, match="need at least"):
        make_schedule(minutes=5, seed=0, repeats=3)
    with pytest.raises(ValueError, match="unknown faults"):
        make_schedule(minutes=30, seed=0, faults=("kill_everything",))
