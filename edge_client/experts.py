"""Scripted DOM-oracle experts: one per MiniWoB++ task, each a Policy with version "expert".

An expert reads `Observation.dom` (miniwob's DOMElement tree; boxes are CSS pixels, which are
screenshot pixels because the browser runs at device scale factor 1) and the instruction, and
returns a Decision: a short thought in the words a model should learn to say, a click at the centre
of the *visible* part of the target, and what should happen next. Experts keep no state between
steps: every step re-reads the DOM, so a multi-step expert resumes correctly from any screen.

Coordinates are rounded to whole pixels; thoughts quote them the same way.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np
from miniwob.constants import TASK_HEIGHT, TASK_WIDTH
from miniwob.dom import DOMElement

from edge_client.env import task_name
from edge_client.policy import Decision, Observation, Policy
from edge_client.verify import EXPECT_SUCCESS, expect_change_near, expect_text
from schemas import Action

Solver = Callable[[Observation], Decision]


class UnsupportedTaskError(KeyError):
    """No scripted expert exists for this task."""


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


def visible_point(target: DOMElement, root: DOMElement) -> tuple[int, int]:
    """The pixel of `target` farthest from anything that may cover it, and from its own edges.

    Covering candidates are elements painted after the target (later in document order) that are
    neither its ancestors nor its descendants and overlap its box. That is conservative: a later
    transparent element also counts. If nothing of the target is left, fall back to its centre.
    The box is clipped to the 160x210 task area, the only part a click can reach.
    """
    x0, y0 = max(target.left, 0.0), max(target.top, 0.0)
    x1, y1 = min(target.right, float(TASK_WIDTH)), min(target.bottom, float(TASK_HEIGHT))
    if x1 - x0 < 1 or y1 - y0 < 1:
        raise LookupError(f"target <{target.tag}> {text_of(target)!r} is outside the task area")
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
        return round((x0 + x1) / 2), round((y0 + y1) / 2)
    # Among the best points prefer the one nearest the box centre, so unoccluded targets are
    # clicked dead centre (the familiar "centre of the element").
    best = clearance >= clearance.max() - 0.5
    centre_dist = (gx - (x0 + x1) / 2) ** 2 + (gy - (y0 + y1) / 2) ** 2
    iy, ix = np.unravel_index(np.where(best, centre_dist, np.inf).argmin(), gx.shape)
    return int(gx[iy, ix]), int(gy[iy, ix])


def click(target: DOMElement, root: DOMElement, thought: str, expected: str = EXPECT_SUCCESS) -> Decision:
    """Click the visible centre of `target`; `thought` may use {x} and {y}."""
    x, y = visible_point(target, root)
    action = Action(type="click", x=float(x), y=float(y))
    return Decision(thought=thought.format(x=x, y=y), action=action, expected=expected)


def click_then(target: DOMElement, root: DOMElement, thought: str) -> Decision:
    """An intermediate click: the screen should change where we click."""
    x, y = visible_point(target, root)
    return click(target, root, thought, expect_change_near(x, y))


def type_text(text: str, thought: str) -> Decision:
    return Decision(thought=thought, action=Action(type="type", text=text), expected=expect_text(text))


# --- Tier 1 ------------------------------------------------------------------------------------


def solve_click_test(obs: Observation) -> Decision:
    button = find(obs.dom, lambda e: e.tag == "button", "the button")
    return click(button, obs.dom, "There is a single button, at ({x}, {y}). Click it.")


def solve_click_test_2(obs: Observation) -> Decision:
    # "Click button ONE." The two buttons are absolutely positioned and may overlap.
    wanted = re.search(r"button (\w+)", obs.instruction)
    label = wanted.group(1) if wanted else ""
    button = find(obs.dom, lambda e: e.tag == "button" and text_of(e) == label, f"button {label!r}")
    thought = f"The instruction asks for button {label}; its visible part is at ({{x}}, {{y}}). Click it."
    return click(button, obs.dom, thought)


def solve_click_button(obs: Observation) -> Decision:
    # 'Click on the "okay" button.' Several buttons may carry the same label: any of them is right.
    label = quoted(obs.instruction)[0]
    button = find(obs.dom, lambda e: e.tag == "button" and text_of(e) == label, f"button {label!r}")
    return click(button, obs.dom, f"The instruction asks for the '{label}' button; it is at ({{x}}, {{y}}). Click it.")


def solve_click_link(obs: Observation) -> Decision:
    # 'Click on the link "Eget".' Case matters: "eget" is a different (wrong) link.
    label = quoted(obs.instruction)[0]
    link = find(obs.dom, lambda e: has_class(e, "alink") and text_of(e) == label, f"link {label!r}")
    return click(link, obs.dom, f"The link '{label}' is at ({{x}}, {{y}}). Click it.")


def solve_click_dialog(obs: Observation) -> Decision:
    # jQuery UI dialog: the close "x" is a button in the title bar; resize handles sit over its corner.
    close = find(obs.dom, lambda e: e.tag == "button" and has_class(e, "ui-dialog-titlebar-close"), "the close button")
    return click(close, obs.dom, "The dialog's close button 'x' is at ({x}, {y}) in its title bar. Click it.")


# CSS named colours used by click-color, as RGB in 0..1 (the DOM reports computed background colours).
_CSS_COLOURS: dict[str, tuple[float, float, float]] = {
    name: (r / 255, g / 255, b / 255)
    for name, (r, g, b) in {
        "red": (255, 0, 0),
        "blue": (0, 0, 255),
        "olive": (128, 128, 0),
        "lime": (0, 255, 0),
        "black": (0, 0, 0),
        "white": (255, 255, 255),
        "grey": (128, 128, 128),
        "gray": (128, 128, 128),
        "purple": (128, 0, 128),
        "orange": (255, 165, 0),
        "yellow": (255, 255, 0),
        "cyan": (0, 255, 255),
        "pink": (255, 192, 203),
        "magenta": (255, 0, 255),
        "green": (0, 128, 0),
        "aqua": (0, 255, 255),
    }.items()
}


def solve_click_color(obs: Observation) -> Decision:
    # "Click on the red colored box." The boxes are div.color; match their computed colour.
    match = re.search(r"Click on the (\w+) colou?red box", obs.instruction)
    if not match or match.group(1).lower() not in _CSS_COLOURS:
        raise LookupError(f"no known colour in {obs.instruction!r}")
    name = match.group(1).lower()
    want = np.array(_CSS_COLOURS[name])
    boxes = find_all(obs.dom, lambda e: has_class(e, "color"))
    if not boxes:
        raise LookupError("no colour boxes in the DOM")
    box = min(boxes, key=lambda e: float(np.abs(np.array(e.bg_color[:3]) - want).sum()))
    return click(box, obs.dom, f"The {name} box is at ({{x}}, {{y}}). Click it.")


def solve_focus_text(obs: Observation) -> Decision:
    field = find(obs.dom, lambda e: e.tag.startswith("input"), "the text box")
    return click(field, obs.dom, "The text box is at ({x}, {y}). Click into it to focus it.")


# identify-shape draws one SVG element; the buttons carry the answer's name.
_SHAPE_BUTTON = {"rect": "Rectangle", "circle": "Circle", "polygon": "Triangle"}


def solve_identify_shape(obs: Observation) -> Decision:
    svg = find(obs.dom, lambda e: e.id == "area_svg", "the figure")
    shape = find(svg, lambda e: e is not svg, "a shape in the figure")
    if shape.tag == "text":
        content = (shape.text or "").strip()
        kind, label = ("a digit", "Number") if content.isdigit() else ("a letter", "Letter")
        seen = f"The figure is the character '{content}', {kind}."
    elif shape.tag in _SHAPE_BUTTON:
        label = _SHAPE_BUTTON[shape.tag]
        seen = f"The figure is a {label.lower()}."
    else:
        raise LookupError(f"unknown figure <{shape.tag}>")
    button = find(obs.dom, lambda e: e.tag == "button" and text_of(e) == label, f"button {label!r}")
    return click(button, obs.dom, f"{seen} The '{label}' button is at ({{x}}, {{y}}). Click it.")


# --- registry ----------------------------------------------------------------------------------

SOLVERS: dict[str, Solver] = {
    "click-test": solve_click_test,
    "click-test-2": solve_click_test_2,
    "click-button": solve_click_button,
    "click-link": solve_click_link,
    "click-dialog": solve_click_dialog,
    "click-color": solve_click_color,
    "focus-text": solve_focus_text,
    "identify-shape": solve_identify_shape,
}


@dataclass(frozen=True)
class DomExpert:
    """A Policy that solves one task by reading the DOM."""

    task: str
    solve: Solver
    version: str = "expert"

    def act(self, obs: Observation) -> Decision:
        if obs.dom is None:
            raise ValueError(f"the {self.task} expert needs the DOM, and this observation has none")
        return self.solve(obs)


def supported_tasks() -> list[str]:
    return sorted(SOLVERS)


def expert_for(task: str) -> Policy:
    """The scripted expert for `task` ('click-test' or 'miniwob/click-test-v1')."""
    name = task_name(task)
    if name not in SOLVERS:
        raise UnsupportedTaskError(f"no scripted expert for {task!r}; supported: {', '.join(supported_tasks())}")
    return DomExpert(name, SOLVERS[name])
