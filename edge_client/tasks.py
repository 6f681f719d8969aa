"""The MiniWoB++ tasks this machine can run: their names, and the refusal of one it cannot, before any browser starts.
Light on purpose (no selenium): the CLI checks a --tasks flag with it while it reads the command line."""

from __future__ import annotations

import difflib
from collections.abc import Sequence
from pathlib import Path

import miniwob


def task_name(task: str) -> str:
    """'miniwob/click-test-v1' or 'click-test' -> 'click-test'."""
    name = task.removeprefix("miniwob/")
    head, sep, version = name.rpartition("-v")
    return head if sep and version.isdigit() else name


def runnable_tasks() -> frozenset[str]:
    """The task names GuiEnv can run: a page in miniwob's html/miniwob and a field extractor for its utterance
    (miniwob ships pages without one, e.g. button-delay and hover-shape; switching to them raises KeyError)."""
    from miniwob.fields import FIELD_EXTRACTORS

    pages = {page.stem for page in (Path(miniwob.__file__).parent / "html" / "miniwob").glob("*.html")}
    return frozenset(pages & set(FIELD_EXTRACTORS))


def check_runnable(tasks: Sequence[str]) -> tuple[str, ...]:
    """`tasks` as they are, or a ValueError naming every one MiniWoB++ cannot run (before any browser starts, so a
    run never dies half-way on its fourth task)."""
    known = runnable_tasks()
    bad = [t for t in tasks if task_name(t) not in known]
    if bad:
        hints = {t: difflib.get_close_matches(task_name(t), sorted(known), n=1) for t in bad}
        named = ", ".join(f"{t!r}" + (f" (did you mean {hints[t][0]!r}?)" if hints[t] else "") for t in bad)
        raise ValueError(f"MiniWoB++ cannot run {named}: no such task page with a field extractor in miniwob "
                         f"{getattr(miniwob, '__version__', '')}".rstrip())  # fmt: skip
    return tuple(tasks)
