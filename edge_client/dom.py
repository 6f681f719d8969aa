"""Reading miniwob's DOM and acting on it: the words every DOM-reading policy (the experts, the audit) speaks.

Boxes are CSS pixels, which are screenshot pixels because the browser runs at device scale factor 1. A click goes
to the centre of the *visible* part of its target (what is not covered by a later-painted element), rounded to
whole pixels; each Decision carries what should happen next (policy.expectations).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator

import numpy as np
from miniwob.constants import TASK_HEIGHT, TASK_WIDTH
from miniwob.dom import DOMElement

from policy.expectations import EXPECT_CHANGE, EXPECT_SUCCESS, expect_change_near, expect_text
from policy.interface import Decision
from schemas import Action

# --- reading the DOM ---------------------------------------------------------------------------


def walk(root: DOMElement) -> Iterator[DOMElement]:
    """Elements in document (pre-)order, which is also paint order for same-stacking siblings."""
    yield root
    for child in root.children:
        yield from walk(child)


def find_all(root: DOMElement, pred: Callable[[DOMElement], bool]) -> list[DOMElement]:
    return [el for el in walk(root) if pred(el)]


def find(root: DOMElement, pred: Callable[[DOMElement], bool], what: str) -> DOMElement:
    found = find_all(root, pred)
    if not found:
        raise LookupError(f"expert could not find {what} in the DOM")
    return found[0]


def text_of(el: DOMElement) -> str:
    """Text of an element and its descendants, whitespace-normalised."""
    parts = [e.text for e in walk(el) if e.text]
    return " ".join(" ".join(parts).split())


def has_class(el: DOMElement, name: str) -> bool:
    return name in el.classes.split()


def quoted(instruction: str) -> list[str]:
    """Strings in double quotes, in order: 'Click on the "okay" button.' -> ['okay']."""
    return re.findall(r'"([^"]*)"', instruction)


def _is_inside(el: DOMElement, ancestor: DOMElement) -> bool:
    node: DOMElement | None = el
    while node is not None:
        if node is ancestor:
            return True
        node = node.parent
    return False


# --- where to click ----------------------------------------------------------------------------


def visible_point(target: DOMElement, root: DOMElement, within: DOMElement | None = None) -> tuple[int, int] | None:
    """The pixel of `target` farthest from anything that may cover it and from its own edges, or
    None when nothing of it can be clicked.

    Covering candidates are elements painted after the target (later in document order) that are
    neither its ancestors nor its descendants and overlap its box. That is conservative: a later
    transparent element also counts. The box is clipped to the 160x210 task area, the only part a
    click can reach, and to `within`, a scrolling container whose overflow is hidden.
    """
    x0, y0 = max(target.left, 0.0), max(target.top, 0.0)
    x1, y1 = min(target.right, float(TASK_WIDTH)), min(target.bottom, float(TASK_HEIGHT))
    if within is not None:
        x0, y0 = max(x0, within.left), max(y0, within.top)
        x1, y1 = min(x1, within.right), min(y1, within.bottom)
    if x1 - x0 < 1 or y1 - y0 < 1:
        return None
    order = list(walk(root))
    after = order[order.index(target) + 1 :] if target in order else []
    covers = [
        el
        for el in after
        if not _is_inside(el, target)
        and el.tag != "t"  # text pseudo-elements belong to their parent's box
        and el.left < x1
        and el.right > x0
        and el.top < y1
        and el.bottom > y0
    ]
    # Pixel centres of the clipped box: xs has shape (W,), ys (H,).
    xs = np.arange(np.floor(x0), np.ceil(x1)) + 0.5
    ys = np.arange(np.floor(y0), np.ceil(y1)) + 0.5
    gx, gy = np.meshgrid(xs, ys)  # (H, W)
    # Clearance = distance to the nearest own edge or covering box (0 inside a covering box).
    clearance = np.minimum.reduce([gx - x0, x1 - gx, gy - y0, y1 - gy])
    for el in covers:
        dx = np.maximum(np.maximum(el.left - gx, gx - el.right), 0.0)
        dy = np.maximum(np.maximum(el.top - gy, gy - el.bottom), 0.0)
        outside = np.maximum(dx, dy)  # Chebyshev distance to the box; 0 inside it
        clearance = np.minimum(clearance, outside)
    if clearance.max() <= 0:
        return None
    # Among the best pixels prefer the one nearest the box centre, so unoccluded targets are
    # clicked dead centre (the familiar "centre of the element").
    best = clearance >= clearance.max() - 1e-6
    centre_dist = (gx - (x0 + x1) / 2) ** 2 + (gy - (y0 + y1) / 2) ** 2
    iy, ix = np.unravel_index(np.where(best, centre_dist, np.inf).argmin(), gx.shape)
    # Click the pixel's top-left corner, its integer coordinate: hit testing includes a box's
    # left/top edge and excludes its right/bottom one, so that point belongs to this pixel.
    return int(np.floor(gx[iy, ix])), int(np.floor(gy[iy, ix]))


def click_point(target: DOMElement, root: DOMElement, within: DOMElement | None = None) -> tuple[int, int]:
    point = visible_point(target, root, within)
    if point is None:
        raise LookupError(f"<{target.tag}> {text_of(target)!r} is covered or outside the task area")
    return point


def click(
    target: DOMElement, root: DOMElement, thought: str, expected: str = EXPECT_SUCCESS, within: DOMElement | None = None
) -> Decision:
    """Click the visible centre of `target`; `thought` may use {x} and {y}."""
    x, y = click_point(target, root, within)
    action = Action(type="click", x=float(x), y=float(y))
    box = (float(target.left), float(target.top), float(target.right), float(target.bottom))
    return Decision(thought=thought.format(x=x, y=y), action=action, expected=expected, target_box=box)


def click_then(target: DOMElement, root: DOMElement, thought: str, within: DOMElement | None = None) -> Decision:
    """An intermediate click: the screen should change where we click."""
    x, y = click_point(target, root, within)
    return click(target, root, thought, expect_change_near(x, y), within)


def type_text(text: str, thought: str) -> Decision:
    return Decision(thought=thought, action=Action(type="type", text=text), expected=expect_text(text))


# --- keys, waiting and scrolling ----------------------------------------------------------------------


def key_press(key: str, thought: str, expected: str = EXPECT_CHANGE) -> Decision:
    return Decision(thought=thought, action=Action(type="key", key=key), expected=expected)


def wait(thought: str, expected: str = EXPECT_CHANGE) -> Decision:
    return Decision(thought=thought, action=Action(type="noop"), expected=expected)


def scroll_down(container: DOMElement, thought: str, dy: float = 50.0) -> Decision:
    x, y = round((container.left + container.right) / 2), round((container.top + container.bottom) / 2)
    return Decision(thought, Action(type="scroll", x=x, y=y, scroll_dy=dy), EXPECT_CHANGE)
