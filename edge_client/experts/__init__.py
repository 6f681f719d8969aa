"""Scripted DOM-oracle experts: one per MiniWoB++ task, each a Policy with version "expert".

An expert reads `Observation.dom` (miniwob's DOMElement tree; boxes are CSS pixels, which are
screenshot pixels because the browser runs at device scale factor 1) and the instruction, and
returns a Decision: a short thought in the words a model should learn to say, a click at the centre
of the *visible* part of the target, and what should happen next. Experts keep no state between
steps: every step re-reads the DOM, so a multi-step expert resumes correctly from any screen. The one
exception is choose-list, whose <select> state the DOM does not report; it follows a plan by step.
Experts raise LookupError when the DOM does not hold what they need (a bug or a broken episode).

Coordinates are rounded to whole pixels; thoughts quote them the same way. The words they read and act in (walk
the DOM, the visible point of a target, click, type, key, scroll) are edge_client.dom's.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from edge_client.experts.tier1 import (
    solve_click_button,
    solve_click_color,
    solve_click_dialog,
    solve_click_link,
    solve_click_test,
    solve_click_test_2,
    solve_focus_text,
    solve_identify_shape,
)
from edge_client.experts.tier2 import (
    solve_choose_list,
    solve_click_button_sequence,
    solve_click_checkboxes,
    solve_click_collapsible,
    solve_click_option,
    solve_click_tab,
    solve_click_widget,
    solve_email_inbox,
    solve_enter_date,
    solve_enter_password,
    solve_enter_text,
    solve_grid_coordinate,
    solve_login_user,
    solve_navigate_tree,
    solve_search_engine,
    solve_use_autocomplete,
)
from edge_client.tasks import task_name
from policy.interface import Decision, Observation, Policy

Solver = Callable[[Observation], Decision]


class UnsupportedTaskError(KeyError):
    """No scripted expert exists for this task."""


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
    # Tier 2
    "click-button-sequence": solve_click_button_sequence,
    "click-checkboxes": solve_click_checkboxes,
    "click-option": solve_click_option,
    "click-tab": solve_click_tab,
    "click-collapsible": solve_click_collapsible,
    "click-widget": solve_click_widget,
    "enter-text": solve_enter_text,
    "enter-password": solve_enter_password,
    "login-user": solve_login_user,
    "use-autocomplete": solve_use_autocomplete,
    "grid-coordinate": solve_grid_coordinate,
    "navigate-tree": solve_navigate_tree,
    "choose-list": solve_choose_list,
    "enter-date": solve_enter_date,
    "search-engine": solve_search_engine,
    "email-inbox": solve_email_inbox,
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
