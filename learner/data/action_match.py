"""Whether a policy's action is a reference's (an expert's step, a teacher's label), and how close it came.

A click matches when it falls inside the reference target's element box (recorded by the experts and the
teacher), or within CLICK_TOLERANCE_PX of its point when no box was recorded; typed text matches case- and
space-insensitively; a key by name; a scroll by direction. Semi-online RL, SOP and the teacher's step reward
(learner.data.teacher_labels.teacher_agreement) all match this one way.
"""

from __future__ import annotations

import numpy as np

from schemas import Action

CLICK_TOLERANCE_PX = 4.0


def action_matches(action: Action, expert: Action, box: list[float] | None) -> bool:
    """Whether `action` is the reference `expert` action (see the module docstring)."""
    if action.type != expert.type:
        return False
    if action.type == "click":
        if box:
            left, top, right, bottom = box
            return left <= action.x <= right and top <= action.y <= bottom
        return abs(action.x - expert.x) <= CLICK_TOLERANCE_PX and abs(action.y - expert.y) <= CLICK_TOLERANCE_PX
    if action.type == "type":
        return " ".join(action.text.split()).casefold() == " ".join(expert.text.split()).casefold()
    if action.type == "key":
        return action.key == expert.key
    if action.type == "scroll":
        return np.sign(action.scroll_dy) == np.sign(expert.scroll_dy)
    return True


def action_score(action: Action | None, expert: Action, box: list[float] | None) -> float:
    """1 the expert's action, 0.5 its type only, 0.1 an action of another type, 0 none parsed."""
    if action is None:
        return 0.0
    if action.type != expert.type:
        return 0.1
    return 1.0 if action_matches(action, expert, box) else 0.5


def expert_action(row: dict) -> Action:
    """The action of a step row (action_type, x, y, text, key)."""
    return Action(type=row["action_type"], x=row["x"] or 0.0, y=row["y"] or 0.0, text=row["text"] or "",
                  key=row["key"] or "")  # fmt: skip
