"""The Tier 2 experts: a few steps each; every step re-reads the DOM to see how far the task has got
(edge_client.experts)."""

from __future__ import annotations

import re
from collections.abc import Callable

from miniwob.dom import DOMElement

from edge_client.dom import (
    click,
    click_then,
    find,
    find_all,
    has_class,
    key_press,
    quoted,
    scroll_down,
    text_of,
    type_text,
    visible_point,
    wait,
)
from policy.expectations import EXPECT_CHANGE, expect_change_near
from policy.interface import Decision, Observation
from schemas import Action


def fill(field: DOMElement, value: str, root: DOMElement, label: str, focus_ring: bool = True) -> Decision | None:
    """The next step towards `field` holding exactly `value`, or None when it already does.

    focus_ring: the field shows a focus outline, so clicking it visibly changes the screen there.
    Without one (email-inbox styles `outline: none`) only a blinking caret appears, which a
    screenshot may or may not catch, so that click's outcome is not checkable from pixels.
    Recovery from wrong text is by Backspace, one character a step, assuming the caret is at the end
    (where typing leaves it).
    """
    current = str(field.value or "")
    if current == value:
        return None
    if not field.focused:
        thought = f"Click the {label} field at ({{x}}, {{y}}) to type into it."
        if focus_ring:
            return click_then(field, root, thought)
        return click(field, root, thought, f"the {label} field takes the focus")
    if value.startswith(current):
        rest = value[len(current) :]
        return type_text(rest, f"The {label} field is focused. Type '{rest}'.")
    return key_press("<Backspace>", f"The {label} field holds '{current}', which is wrong. Delete a character.")


def submit(root: DOMElement, label: str = "Submit", why: str = "") -> Decision:
    button = find(root, lambda e: e.tag == "button" and text_of(e).lower() == label.lower(), f"the {label} button")
    return click(button, root, f"{why}Click '{text_of(button)}' at ({{x}}, {{y}}).".strip())


def solve_click_button_sequence(obs: Observation) -> Decision:
    # The page records every clicked element as "tampered": ONE clicked means TWO is next.
    one = find(obs.dom, lambda e: e.tag == "button" and text_of(e) == "ONE", "button ONE")
    two = find(obs.dom, lambda e: e.tag == "button" and text_of(e) == "TWO", "button TWO")
    if not one.tampered:
        return click(
            one, obs.dom, "First button ONE, at ({x}, {y}).", "button ONE takes the click; nothing visible changes"
        )
    return click(two, obs.dom, "Button ONE is done; now button TWO, at ({x}, {y}).")


def _labelled_inputs(root: DOMElement, tag: str) -> dict[str, DOMElement]:
    """label text -> the input inside that <label> (click-checkboxes, click-option)."""
    found = {}
    for label in find_all(root, lambda e: e.tag == "label"):
        inputs = [c for c in label.children if c.tag == tag]
        if inputs:
            found[text_of(label)] = inputs[0]
    return found


def solve_click_checkboxes(obs: Observation) -> Decision:
    # "Select HF2, x7 and click Submit." / "Select nothing and click Submit."
    match = re.match(r"Select (.*) and click Submit\.", obs.instruction)
    if not match:
        raise LookupError(f"unexpected instruction {obs.instruction!r}")
    wanted = set() if match.group(1) == "nothing" else set(match.group(1).split(", "))
    for name, box in _labelled_inputs(obs.dom, "input_checkbox").items():
        if bool(box.value) != (name in wanted):
            verb = "tick" if name in wanted else "untick"
            return click_then(
                box, obs.dom, f"The checkbox '{name}' needs to {verb}; it is at ({{x}}, {{y}}). Click it."
            )
    return submit(obs.dom, why="Every checkbox is as asked. ")


def solve_click_option(obs: Observation) -> Decision:
    match = re.match(r"Select (.*) and click Submit\.", obs.instruction)
    if not match:
        raise LookupError(f"unexpected instruction {obs.instruction!r}")
    name = match.group(1)
    radios = _labelled_inputs(obs.dom, "input_radio")
    if name not in radios:
        raise LookupError(f"no option {name!r}")
    if not radios[name].value:
        return click_then(radios[name], obs.dom, f"The option '{name}' is at ({{x}}, {{y}}). Select it.")
    return submit(obs.dom, why=f"'{name}' is selected. ")


def solve_click_tab(obs: Observation) -> Decision:
    match = re.search(r"Tab #\d+", obs.instruction)
    label = match.group(0) if match else ""
    tab = find(obs.dom, lambda e: e.tag == "a" and text_of(e) == label, f"the tab {label!r}")
    return click(tab, obs.dom, f"The tab '{label}' is at ({{x}}, {{y}}). Click it.")


def solve_click_collapsible(obs: Observation) -> Decision:
    # A collapsed section's content is display:none, so it is absent from the DOM until expanded.
    if not find_all(obs.dom, lambda e: has_class(e, "ui-accordion-content")):
        header = find(obs.dom, lambda e: e.tag == "h3", "the section header")
        return click_then(
            header, obs.dom, f"The section '{text_of(header)}' is collapsed; click its header at ({{x}}, {{y}})."
        )
    return submit(obs.dom, why="The section is expanded. ")


# click-widget names widgets by type; the DOM tag says which control each widget holds.
_WIDGET_TAGS = {
    "radio": "input_radio",
    "checkbox": "input_checkbox",
    "text": "input_text",
    "textarea": "textarea",
    "button": "button",
}


def solve_click_widget(obs: Observation) -> Decision:
    kind = quoted(obs.instruction)[0]
    tag = _WIDGET_TAGS.get(kind)
    control = find(
        obs.dom,
        lambda e: (
            e.tag == tag
            and e.parent is not None
            and (
                has_class(e.parent, "widget") or (e.parent.parent is not None and has_class(e.parent.parent, "widget"))
            )
        ),
        f"a {kind} widget",
    )
    return click(control, obs.dom, f"A {kind} widget is at ({{x}}, {{y}}). Click it.")


def solve_enter_text(obs: Observation) -> Decision:
    text = quoted(obs.instruction)[0]
    field = find(obs.dom, lambda e: e.id == "tt", "the text field")
    return fill(field, text, obs.dom, "text") or submit(obs.dom, why=f"The field holds '{text}'. ")


def solve_enter_password(obs: Observation) -> Decision:
    password = quoted(obs.instruction)[0]
    for field_id, label in (("password", "password"), ("verify", "verify password")):
        field = find(obs.dom, lambda e, i=field_id: e.id == i, f"the {label} field")
        step = fill(field, password, obs.dom, label)
        if step is not None:
            return step
    return submit(obs.dom, why="Both fields hold the password. ")


def solve_login_user(obs: Observation) -> Decision:
    user, password = quoted(obs.instruction)[:2]
    for field_id, value in (("username", user), ("password", password)):
        field = find(obs.dom, lambda e, i=field_id: e.id == i, f"the {field_id} field")
        step = fill(field, value, obs.dom, field_id)
        if step is not None:
            return step
    return submit(obs.dom, "Login", why="Username and password are filled in. ")


def solve_use_autocomplete(obs: Observation) -> Decision:
    # 'Enter an item that starts with "An" and ends with "ica".' (the "ends with" part is optional)
    parts = quoted(obs.instruction)
    prefix, suffix = parts[0], (parts[1] if len(parts) > 1 else "")
    field = find(obs.dom, lambda e: e.id == "tags", "the text field")
    value = str(field.value or "")
    menu = find_all(obs.dom, lambda e: has_class(e, "ui-menu-item-wrapper"))
    done = value.startswith(prefix) and value.endswith(suffix)
    submit_button = find(obs.dom, lambda e: e.id == "subbtn", "the Submit button")
    if done and visible_point(submit_button, obs.dom) is not None:
        return submit(obs.dom, why=f"The field holds '{value}', which fits. ")
    if done:
        # Tab moves the focus to Submit; leaving the field closes the suggestions.
        return key_press("<Tab>", "The suggestions cover Submit; press Tab to leave the field and close them.")
    fits = [m for m in menu if text_of(m).startswith(prefix) and text_of(m).endswith(suffix)]
    if fits and visible_point(fits[0], obs.dom) is not None:
        return click_then(
            fits[0], obs.dom, f"The suggestion '{text_of(fits[0])}' fits; it is at ({{x}}, {{y}}). Pick it."
        )
    if fits:
        # The fitting suggestion is below the task area: typing the rest of it is shorter than scrolling.
        item = text_of(fits[0])
        if field.focused and item.startswith(value):
            rest = item[len(value) :]
            return type_text(rest, f"'{item}' fits but is below the visible list; type the rest, '{rest}'.")
        return fill(field, item, obs.dom, "text")
    if value == prefix:
        # Suggestions come 300 ms after typing; until then the menu is absent (or left over from before).
        return wait(f"I typed '{prefix}'; wait for the suggestions to appear.")
    step = fill(field, prefix, obs.dom, "text")
    if step is None:
        raise LookupError(f"no suggestion starts with {prefix!r} and ends with {suffix!r}")
    return step


def solve_grid_coordinate(obs: Observation) -> Decision:
    match = re.search(r"\(-?\d+,-?\d+\)", obs.instruction)
    coord = match.group(0) if match else ""
    point = find(obs.dom, lambda e: e.tag == "circle" and e.id == coord, f"the point {coord}")
    return click(point, obs.dom, f"The grid point {coord} is at ({{x}}, {{y}}). Click it.")


def solve_navigate_tree(obs: Observation) -> Decision:
    # Collapsed folders hide their children (absent from the DOM), so open folders until the name shows.
    name = quoted(obs.instruction)[0]
    named = [
        e
        for e in find_all(obs.dom, lambda e: e.tag == "span" and text_of(e) == name)
        if visible_point(e, obs.dom) is not None
    ]
    if named:
        return click(named[0], obs.dom, f"'{name}' is visible at ({{x}}, {{y}}). Click it.")
    closed = find(obs.dom, lambda e: has_class(e, "expandable-hitarea"), f"a closed folder that may hold {name!r}")
    folder = find(closed.parent, lambda e: e.tag == "span", "the folder name")
    return click_then(
        closed, obs.dom, f"'{name}' is not visible yet; open the folder '{text_of(folder)}' at ({{x}}, {{y}})."
    )


def solve_choose_list(obs: Observation) -> Decision:
    # The options of a <select> have no boxes in the DOM and the selection is not reported, so this
    # expert follows a fixed plan by step: open the list, type the name, Enter, Submit.
    match = re.match(r"Select (.*) from the list and click Submit\.", obs.instruction)
    name = match.group(1) if match else ""
    select = find(obs.dom, lambda e: e.tag == "select", "the list")
    if obs.step == 0 or not select.focused:
        return click_then(select, obs.dom, "Open the list at ({x}, {y}).")
    if obs.step == 1:
        # The open list moves its highlight, unless the name is highlighted already: not checkable.
        thought = f"The list is open. Type '{name}' to jump to it."
        return Decision(thought, Action(type="type", text=name), f"the list highlights '{name}'")
    if obs.step == 2:
        return key_press("<Enter>", f"'{name}' is highlighted. Press Enter to choose it.")
    return submit(obs.dom, why=f"'{name}' is chosen. ")


def solve_enter_date(obs: Observation) -> Decision:
    # A date input takes digits segment by segment (mm, dd, yyyy) and reports value as yyyy-mm-dd.
    match = re.search(r"(\d\d)/(\d\d)/(\d{4})", obs.instruction)
    if not match:
        raise LookupError(f"no date in {obs.instruction!r}")
    month, day, year = match.groups()
    field = find(obs.dom, lambda e: e.tag == "input_date", "the date field")
    if field.value == f"{year}-{month}-{day}":
        return submit(obs.dom, why=f"The date field shows {month}/{day}/{year}. ")
    if not field.focused:
        # Click the month segment at the left end; the right end opens the calendar instead.
        x, y = round(field.left + 10), round(field.top + field.height / 2)
        return Decision(
            f"Click the month part of the date field at ({x}, {y}).",
            Action(type="click", x=x, y=y),
            expect_change_near(x, y),
            target_box=(field.left, field.top, field.left + field.width / 3, field.bottom),  # the month segment
        )
    return type_text(f"{month}{day}{year}", f"The date field is focused. Type {month}{day}{year}.")


def solve_search_engine(obs: Observation) -> Decision:
    # 'Use the textbox to enter "Renda" and press "Search", then find and click the 7th search result.'
    query = quoted(obs.instruction)[0]
    match = re.search(r"the (\d+)\w\w search result", obs.instruction)
    rank = int(match.group(1)) if match else 1
    page, slot = (rank - 1) // 3 + 1, (rank - 1) % 3  # three results a page
    field = find(obs.dom, lambda e: e.id == "search-text", "the search box")
    step = fill(field, query, obs.dom, "search")
    if step is not None:
        return step
    results = find_all(obs.dom, lambda e: has_class(e, "search-title"))
    if not results:
        button = find(obs.dom, lambda e: e.id == "search", "the Search button")
        # The results appear below the search bar, not where we click.
        return click(button, obs.dom, f"The box holds '{query}'. Click Search at ({{x}}, {{y}}).", EXPECT_CHANGE)
    active = find(obs.dom, lambda e: has_class(e, "active"), "the current page")
    if text_of(active) != str(page):
        link = find(obs.dom, lambda e: has_class(e, "page-link") and text_of(e) == str(page), f"page {page}")
        return click_then(link, obs.dom, f"Result {rank} is on page {page}; click '{page}' at ({{x}}, {{y}}).")
    target = results[slot]
    return click(target, obs.dom, f"Result {rank} is '{text_of(target)}' at ({{x}}, {{y}}). Click it.")


_EMAIL_TASK = re.compile(
    r"Find the email by (?P<sender>.+?) and (?:"
    r'reply to them with the text "(?P<reply>.*)"'
    r"|forward that email to (?P<forward>.+?)"
    r"|click the trash icon to (?P<delete>delete) it"
    r"|click the star icon to mark it as (?P<star>important))\.$"
)


def solve_email_inbox(obs: Observation) -> Decision:
    """Open the sender's email (from the list, or through search when it is scrolled out of view),
    then star / delete / reply / forward. The inbox, the search page and an open email are each a
    150 px scrolling pane, so visibility is judged within the pane."""
    task = _EMAIL_TASK.match(obs.instruction)
    if not task:
        raise LookupError(f"unexpected instruction {obs.instruction!r}")
    sender, dom = task["sender"], obs.dom
    icon = "trash" if task["delete"] else "star" if task["star"] else None  # one click on an icon does it

    def first(root: DOMElement, pred: Callable[[DOMElement], bool]) -> DOMElement | None:
        return next(iter(find_all(root, pred)), None)

    def sender_of(thread: DOMElement) -> DOMElement:
        return find(thread, lambda e: has_class(e, "email-sender"), "the sender")

    def send_with_arrow(arrow_id: str, thought: str) -> Decision:
        # The arrow is a CSS `content:` image: it has no size, so is not in the DOM, until send.png loads.
        send = first(dom, lambda e: e.id == arrow_id)
        if send is None:
            return wait("The send arrow has not appeared yet; wait for it.")
        return click(send, dom, thought)

    reply_text = first(dom, lambda e: e.id == "reply-text")
    if reply_text is not None:
        thought = f"The reply says '{task['reply']}'. Send it with the arrow at ({{x}}, {{y}})."
        return fill(reply_text, task["reply"], dom, "reply", focus_ring=False) or send_with_arrow("send-reply", thought)
    forward_to = first(dom, lambda e: has_class(e, "forward-sender"))
    if forward_to is not None:
        thought = f"The email goes to {task['forward']}. Send it with the arrow at ({{x}}, {{y}})."
        return fill(forward_to, task["forward"], dom, "recipient", focus_ring=False) or send_with_arrow(
            "send-forward", thought
        )

    email = first(dom, lambda e: e.id == "email")
    if email is not None:
        if icon is not None:
            target = find(email, lambda e: has_class(e, icon), f"the {icon} icon")
            thought = f"{sender}'s email is open. Click the {icon} icon at ({{x}}, {{y}})."
            return click(target, dom, thought, within=email)
        kind, what = ("email-reply", "Reply") if task["reply"] is not None else ("email-forward", "Forward")
        target = find(email, lambda e: has_class(e, kind), f"the {what} button")
        if visible_point(target, dom, email) is None:
            return scroll_down(email, f"{sender}'s email is open; {what} is below. Scroll down.")
        return click_then(target, dom, f"{sender}'s email is open. Click {what} at ({{x}}, {{y}}).", within=email)

    inbox = first(dom, lambda e: e.id == "main")
    if inbox is not None:
        for thread in find_all(inbox, lambda e: has_class(e, "email-thread")):
            if text_of(sender_of(thread)) != sender:
                continue
            if icon is not None:
                target = find(thread, lambda e: has_class(e, icon), f"the {icon} icon")
                thought = f"The email by {sender} is in the list. Click its {icon} icon at ({{x}}, {{y}})."
                if visible_point(target, dom, inbox) is not None:
                    return click(target, dom, thought, within=inbox)
            elif visible_point(sender_of(thread), dom, inbox) is not None:
                thought = f"The email by {sender} is at ({{x}}, {{y}}). Open it."
                return click_then(sender_of(thread), dom, thought, within=inbox)
        search_icon = find(dom, lambda e: e.id == "open-search", "the search icon")
        return click_then(search_icon, dom, f"No email by {sender} in view. Open search at ({{x}}, {{y}}).")

    pane = first(dom, lambda e: e.id == "search")
    search_box = first(dom, lambda e: e.id == "search-input")
    if pane is None or search_box is None:
        raise LookupError("neither the inbox, the search page nor an email is showing")
    step = fill(search_box, sender, dom, "search", focus_ring=False)
    if step is not None:
        return step
    for thread in find_all(pane, lambda e: has_class(e, "email-thread")):
        name = sender_of(thread)
        if text_of(name) == sender and visible_point(name, dom, pane) is not None:
            return click_then(name, dom, f"The search found {sender}'s email at ({{x}}, {{y}}). Open it.", within=pane)
    return wait(f"Searching for {sender}; wait for the results.")
