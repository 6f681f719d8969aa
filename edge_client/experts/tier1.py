"""The Tier 1 experts: one click (or one typed word) on one screen, read from the DOM (edge_client.experts)."""

from __future__ import annotations

import re

import numpy as np

from edge_client.dom import (
    click,
    find,
    find_all,
    has_class,
    quoted,
    text_of,
)
from policy.interface import Decision, Observation


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
