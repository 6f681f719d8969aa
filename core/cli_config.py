"""Command-line flags derived from a config dataclass, so each setting has one default and one description.

Every field becomes `--field-name`: the type comes from the annotation, the default from the dataclass and
the help from the field's attribute docstring (the string literal right below it). The parsed values land
under `ClassName.field` in the namespace, so two configs, or a config and a plain flag, never collide;
`config_from` builds the dataclass back.

    int, float, str, Path   that type
    bool                    --x / --no-x
    tuple[T, ...]           a comma-separated list of T ('' is the empty tuple)
    Literal[...]            one of its values
    T | None                T, or the word 'none' for None

Other annotations (dict, nested dataclasses ...) need a `parse` override or an `exclude`.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import inspect
import textwrap
import types
import typing
from collections.abc import Callable, Iterable, Mapping
from functools import cache
from pathlib import Path
from typing import Any

PLAIN_TYPES = (int, float, str, Path)


@cache
def field_docs(cls: type) -> dict[str, str]:
    """Attribute docstrings of a dataclass's fields (base classes first, so subclasses override), whitespace
    folded; fields without one are absent."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if not dataclasses.is_dataclass(klass):
            continue
        try:
            tree = ast.parse(textwrap.dedent(inspect.getsource(klass)))
        except (OSError, TypeError):  # no source (built in a REPL, or a frozen install): no help texts
            continue
        body = next(node for node in tree.body if isinstance(node, ast.ClassDef)).body
        for node, after in zip(body, body[1:], strict=False):
            if (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
                    and isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant)
                    and isinstance(after.value.value, str)):  # fmt: skip
                docs[node.target.id] = " ".join(after.value.value.split())
    return docs


def add_config_arguments(
    parser: argparse.ArgumentParser | argparse._ArgumentGroup,
    cls: type,
    *,
    exclude: Iterable[str] = (),
    rename: Mapping[str, str | tuple[str, ...]] | None = None,
    parse: Mapping[str, Callable[[str], Any]] | None = None,
    unset: bool = False,
) -> None:
    """One flag per field of dataclass `cls`, except `exclude`.

    rename: field -> its flag, or flags (the first is shown, the others are aliases), where the derived
    `--field-name` is not the one in use. parse: field -> a function of the flag's text to the value, instead
    of the annotation's (e.g. task lists that accept aliases). unset: every flag defaults to None, nothing is
    required, for flags that override values held elsewhere (a recipe file): `config_values` then holds None
    for the flags not given.
    """
    hints = typing.get_type_hints(cls)
    docs, rename, parse, skip = field_docs(cls), rename or {}, parse or {}, set(exclude)
    unknown = (skip | set(rename) | set(parse)) - {f.name for f in dataclasses.fields(cls)}
    if unknown:
        raise ValueError(f"{cls.__name__} has no fields {sorted(unknown)}")
    for f in dataclasses.fields(cls):
        if f.name in skip or not f.init:
            continue
        flags = rename.get(f.name, "--" + f.name.replace("_", "-"))
        flags = (flags,) if isinstance(flags, str) else tuple(flags)
        kwargs = _argument_kwargs(cls, f.name, hints[f.name], parse.get(f.name))
        if unset:
            kwargs["default"] = None
        elif f.default is not dataclasses.MISSING:
            kwargs["default"] = f.default
        elif f.default_factory is not dataclasses.MISSING:
            kwargs["default"] = f.default_factory()
        else:
            kwargs["required"] = True
        if "action" not in kwargs and "choices" not in kwargs:  # choices show themselves
            kwargs.setdefault("metavar", flags[0].lstrip("-").replace("-", "_").upper())
        # '%' would be read as a format specifier by argparse.
        help_text = docs[f.name].replace("%", "%%") if f.name in docs else None
        action = parser.add_argument(*flags, dest=f"{cls.__name__}.{f.name}", help=help_text, **kwargs)
        action.help = help_text  # some Pythons' BooleanOptionalAction append their own "(default: ...)"


def config_values(namespace: argparse.Namespace, cls: type) -> dict[str, Any]:
    """The parsed values of `cls`'s flags, by field name."""
    prefix = cls.__name__ + "."
    return {k.removeprefix(prefix): v for k, v in vars(namespace).items() if k.startswith(prefix)}


def config_from(namespace: argparse.Namespace, cls: type, **extra: Any) -> Any:
    """`cls` from its parsed flags; `extra` supplies (or replaces) fields that are not flags."""
    return cls(**{**config_values(namespace, cls), **extra})


class DefaultsHelpFormatter(argparse.HelpFormatter):
    """Shows each flag's default after its help; override `format_default` to name well-known values."""

    def format_default(self, value: Any) -> str:
        if isinstance(value, tuple):  # as the comma list one would type
            return ",".join(str(v) for v in value) or "''"
        return str(value)

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text, default = action.help, action.default
        if not text or action.required or default is None or default is argparse.SUPPRESS or not action.option_strings:
            return text
        return f"{text} (default: {self.format_default(default).replace('%', '%%')})"


def _argument_kwargs(cls: type, name: str, hint: Any, parse: Callable[[str], Any] | None) -> dict[str, Any]:
    optional = False
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        if len(args) != 1:
            raise TypeError(f"{cls.__name__}.{name}: {hint} has no flag type; pass parse= or exclude it")
        hint, optional = args[0], True
    kwargs: dict[str, Any] = {}
    if parse is not None:
        convert = parse
    elif hint is bool:
        return {"action": argparse.BooleanOptionalAction}
    elif typing.get_origin(hint) is typing.Literal:
        choices = typing.get_args(hint)
        convert, kwargs["choices"] = type(choices[0]), choices + ((None,) if optional else ())
    elif typing.get_origin(hint) is tuple and typing.get_args(hint)[1:] == (Ellipsis,):
        convert = _comma_list(typing.get_args(hint)[0], f"{cls.__name__}.{name}")
    elif hint in PLAIN_TYPES:
        convert = hint
    else:
        raise TypeError(f"{cls.__name__}.{name}: {hint} has no flag type; pass parse= or exclude it")
    kwargs["type"] = _or_none(convert) if optional else convert
    return kwargs


def _comma_list(item: Any, where: str) -> Callable[[str], tuple]:
    if item not in PLAIN_TYPES:
        raise TypeError(f"{where}: tuple items of {item} have no flag type; pass parse= or exclude it")

    def convert(text: str) -> tuple:
        return tuple(item(part.strip()) for part in text.split(",") if part.strip())

    convert.__name__ = f"comma-separated {item.__name__}"  # argparse names the type in its errors
    return convert


def _or_none(convert: Callable[[str], Any]) -> Callable[[str], Any]:
    def or_none(text: str) -> Any:
        return None if text.lower() == "none" else convert(text)

    or_none.__name__ = getattr(convert, "__name__", "value")
    return or_none
