"""Think -> act -> verify: did the screen do what the agent expected?

Expectations are short strings in a small vocabulary, so a model can write them and a checker can
read them:

* "episode ends with success"           -> the episode ended with reward > 0
* "screen changes near (x, y)"          -> pixels changed within RADIUS px of (x, y)
* "text 'abc' appears"                  -> the screen changed (we do not read text from pixels)
* "screen changes"                      -> any pixel changed
* anything else, or ""                  -> nothing checkable: ok is None, the observation is still described

Known limits: a click also moves the pointer, and hover styles or a blinking caret change a few pixels,
so "changed near (x, y)" can hold for a click that did nothing useful. MIN_CHANGED_PIXELS filters
single-pixel noise, not hover effects.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

import numpy as np

from policy.expectations import EXPECT_CHANGE, EXPECT_SUCCESS
from schemas import Action, Verify

if TYPE_CHECKING:  # env.py pulls in selenium; this module stays pure
    from edge_client.env import StepResult

RADIUS = 20  # px: half the side of the square checked around a click; a button is ~20-40 px
PIXEL_THRESHOLD = 24  # max |channel difference| a pixel needs to count as changed (JPEG-free PNGs: 0 noise)
MIN_CHANGED_PIXELS = 4

_NEAR = re.compile(r"changes? near \((-?[\d.]+),\s*(-?[\d.]+)\)")
_TEXT = re.compile(r"text '(.*)' appears")


def changed_mask(before: np.ndarray, after: np.ndarray) -> np.ndarray:
    """(H, W) bool: pixels whose largest channel difference exceeds PIXEL_THRESHOLD."""
    if before.shape != after.shape:
        raise ValueError(f"screenshots differ in shape: {before.shape} vs {after.shape}")
    diff = np.abs(before.astype(np.int16) - after.astype(np.int16))  # (H, W, 3); int16 avoids uint8 wrap-around
    return diff.max(axis=-1) > PIXEL_THRESHOLD


def changed_near(mask: np.ndarray, x: float, y: float, radius: int = RADIUS) -> int:
    """Number of changed pixels in the square of half-side `radius` around (x, y), clipped to the image."""
    h, w = mask.shape
    cx, cy = int(round(x)), int(round(y))
    x0, x1 = max(cx - radius, 0), min(cx + radius + 1, w)
    y0, y1 = max(cy - radius, 0), min(cy + radius + 1, h)
    if x0 >= x1 or y0 >= y1:
        return 0
    return int(mask[y0:y1, x0:x1].sum())


def describe_change(mask: np.ndarray, near: tuple[float, float] | None) -> str:
    """A short sentence: how much changed, and where relative to `near`."""
    total = int(mask.sum())
    if total < MIN_CHANGED_PIXELS:
        return "screen unchanged"
    share = f"{total} px ({100.0 * total / mask.size:.1f}%) of the screen changed"
    if near is None:
        return share
    x, y = near
    local = changed_near(mask, x, y)
    where = "near" if local >= MIN_CHANGED_PIXELS else "but not near"
    return f"{share}, {where} ({round(x)}, {round(y)}) ({local} px there)"


def verify(
    before: np.ndarray,
    after: np.ndarray,
    action: Action,
    expected: str,
    *,
    done: bool = False,
    reward: float = 0.0,
) -> Verify:
    """Compare what `expected` said with what the screens show after `action`.

    before, after: (210, 160, 3) uint8 screenshots. done, reward: the env's verdict for this step;
    once the episode ends miniwob shows a blank screen, so the reward is the only evidence.
    """
    checkable = expected in (EXPECT_SUCCESS, EXPECT_CHANGE) or bool(_NEAR.search(expected) or _TEXT.search(expected))
    if done:
        observed = f"episode ended with reward {reward:g}"
        # Any expectation about a working step is met by a successful ending and missed by a failed one.
        return Verify(expected=expected, observed=observed, ok=(reward > 0) if checkable else None)

    mask = changed_mask(before, after)
    near_match = _NEAR.search(expected)
    point = (float(near_match.group(1)), float(near_match.group(2))) if near_match else None
    if point is None and action.type in ("click", "scroll"):
        point = (action.x, action.y)
    observed = describe_change(mask, point)
    if expected == EXPECT_SUCCESS:
        return Verify(expected=expected, observed=f"episode continues; {observed}", ok=False)
    if near_match:
        return Verify(expected=expected, observed=observed, ok=changed_near(mask, *point) >= MIN_CHANGED_PIXELS)
    if expected == EXPECT_CHANGE or _TEXT.search(expected):
        return Verify(expected=expected, observed=observed, ok=int(mask.sum()) >= MIN_CHANGED_PIXELS)
    return Verify(expected=expected, observed=observed, ok=None)


def verify_step(before: np.ndarray, after: np.ndarray, action: Action, expected: str, result: StepResult) -> Verify:
    """`verify` with done and reward taken from the env's StepResult."""
    return verify(before, after, action, expected, done=result.done, reward=result.reward)
