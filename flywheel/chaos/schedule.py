"""When each fault strikes: a seeded schedule over the run, each kind `repeats` times, never two at once.

The run is cut into one slot per fault; each fault gets a slot (a seeded shuffle, so kinds interleave) and strikes
at a seeded moment inside it, at least `settle_s` after the slot opens and `recover_s` before it closes: the
fault before it has had time to recover, and this one has time to before the next. The same seed gives the same
schedule, so a run that finds a bug can be replayed fault for fault.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

FAULTS = (
    "kill_worker",  # a faust worker SIGKILLed mid-batch (its supervisor starts it again)
    "kill_leader",  # the broker node leading the steps topic's first partition SIGKILLed, started again
    "kill_learner",  # the learner daemon SIGKILLed mid-update, started again: it must resume, not restart
    "cut_client",  # an edge client cut off from the brokers: it spools and replays
    "kill_browser",  # the browser under a client SIGKILLed: the client starts a new one
    "kill9_client",  # a client SIGKILLed mid-episode (an OOM kill), its browser orphaned: back with its spool
    "power_loss",  # a client and its browser SIGKILLed at once (a device losing power): back with its spool
    "corrupt_artifact",  # the newest model artifact corrupted in the store before clients fetch it
    "bad_events",  # a burst of malformed and oversized events on the steps topic
)


@dataclass(frozen=True)
class Strike:
    at_s: float  # seconds after the run starts
    fault: str


def make_schedule(
    minutes: float, seed: int, repeats: int = 2, faults: tuple[str, ...] = FAULTS,
    warmup_s: float = 120.0, settle_s: float = 20.0, recover_s: float = 60.0,
) -> list[Strike]:  # fmt: skip
    """Each of `faults` `repeats` times, after `warmup_s` (the fleet acting, a first version out), in time order.
    ValueError when the run is too short to give every fault its slot."""
    unknown = set(faults) - set(FAULTS)
    if unknown:
        raise ValueError(f"unknown faults {sorted(unknown)}; known: {', '.join(FAULTS)}")
    strikes = [fault for fault in faults for _ in range(repeats)]
    slot_s = (60 * minutes - warmup_s) / max(1, len(strikes))
    if slot_s < settle_s + recover_s:
        need = warmup_s + len(strikes) * (settle_s + recover_s)
        raise ValueError(f"{len(strikes)} faults need at least {need / 60:.1f} min (warm-up, settling, recovery)")
    rng = random.Random(seed)
    rng.shuffle(strikes)
    return [
        Strike(round(warmup_s + k * slot_s + rng.uniform(settle_s, slot_s - recover_s), 1), fault)
        for k, fault in enumerate(strikes)
    ]
