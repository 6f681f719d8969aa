"""The README's Commands table states defaults as `[--flag VALUE]`: each must be what the command really does
without the flag (the parser's default), or a newcomer runs something other than what the page says."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from core.settings import parse_tasks
from flywheel.cli import build_parser

README = Path(__file__).resolve().parents[1] / "README.md"
ROW = re.compile(r"^\| `flywheel ([^`]*)`", re.M)
OPTIONAL = re.compile(r"\[(--[a-z0-9-]+) ([^\]\s|]+)\]")  # [--flag value]: a documented default


def subparser(parser: argparse.ArgumentParser, words: list[str]) -> argparse.ArgumentParser:
    """The (sub)parser of `flywheel w1 w2 ...`: as deep as the words name subcommands."""
    for word in words:
        choices = next((a.choices for a in parser._actions if isinstance(a, argparse._SubParsersAction)), {})
        if word not in choices:
            break
        parser = choices[word]
    return parser


def documented_defaults() -> list[tuple[str, str, str]]:
    """(command, flag, value) of every `[--flag value]` in the Commands table whose value is a literal (not an
    upper-case placeholder such as N or DIR)."""
    found = []
    for row in ROW.findall(README.read_text()):
        command = row.split(" --")[0].split(" [")[0]
        for flag, value in OPTIONAL.findall(row):
            if not value.isupper():
                found.append((command, flag, value))
    return found


def test_every_default_the_readme_states_is_the_commands_default():
    parser = build_parser()
    checked, wrong = 0, []
    for command, flag, value in documented_defaults():
        target = subparser(parser, command.split())
        action = next((a for a in target._actions if flag in a.option_strings), None)
        assert action is not None, f"README: `flywheel {command}` has no flag {flag}"
        default = action.default
        if isinstance(default, tuple):
            same = default == parse_tasks(value) if "tasks" in action.dest else default == tuple(value.split(","))
        elif isinstance(default, (int, float)) and not isinstance(default, bool):
            same = float(value) == float(default)
        else:
            same = str(default) == value
        checked += 1
        if not same:
            wrong.append(f"`flywheel {command}` {flag}: README says {value}, the default is {default!r}")
    assert not wrong, "\n".join(wrong)
    assert checked >= 15  # the table states that many defaults: a regex that found none would prove nothing
