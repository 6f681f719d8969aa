"""Command-line flags derived from a config dataclass, so each setting has one default and one description, and
the command line of a child process derived back from a config, so no setting is copied by hand.

Every field becomes `--field-name`: the type comes from the annotation, the default from the dataclass and
the help from the field's attribute docstring (the string literal right below it). The parsed values land
under `ClassName.field` in the namespace, so two configs, or a config and a plain flag, never collide;
`config_from` builds the dataclass back, and `config_argv` is the inverse: a config -> the flags that parse into it.

    int, float, str, Path   that type
    bool                    --x / --no-x
    tuple[T, ...]           a comma-separated list of T ('' is the empty tuple)
    Literal[...]            one of its values
    T | None                T, or the word 'none' for None
    a dataclass             a node of a nested config: its fields' flags, under their own names (`--poll-s`, not
                            `--learner-poll-s`), each defaulting to the value in the parent's default; the
                            namespace holds them under `ClassName.node.field`

Other annotations (dict ...) need a `parse` override or an `exclude`. One run's settings form one tree (e.g.
flywheel.run.config.DemoConfig: the fleet, its teacher, the learner daemon, the worker): `config_classes` lists a
tree's dataclasses and `conflicting_defaults` the field names they declare twice with different defaults.
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
from dataclasses import dataclass
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


@dataclass(frozen=True)
class ConfigField:
    """One flag-bearing field of a (nested) config: where it sits, who declares it, its type and its default."""

    path: str
    """From the root config: 'poll_s', or 'learner.poll_s' in a node."""
    owner: type
    """The dataclass that declares it."""
    hint: Any
    """Its annotation, resolved."""
    default: Any
    """The value it has in the root's default (or in the instance walked); MISSING when required."""

    @property
    def name(self) -> str:
        return self.path.rsplit(".", 1)[-1]


def config_fields(config: Any, exclude: Iterable[str] = ()) -> list[ConfigField]:
    """Every leaf field of config class `config`, nodes walked (depth first, in declaration order), except the paths
    in `exclude` (a node's path excludes all of it). Given an instance instead of a class, each default is the
    instance's value."""
    skip = set(exclude)
    cls = config if isinstance(config, type) else type(config)
    unknown = skip - _paths(cls)
    if unknown:
        raise ValueError(f"{cls.__name__} has no fields {sorted(unknown)}")
    return list(_walk(cls, None if isinstance(config, type) else config, "", skip))


def _walk(cls: type, instance: Any, prefix: str, skip: set[str]) -> Iterable[ConfigField]:
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        path = prefix + f.name
        if path in skip or not f.init:
            continue
        if instance is not None:
            default = getattr(instance, f.name)
        elif f.default is not dataclasses.MISSING:
            default = f.default
        elif f.default_factory is not dataclasses.MISSING:
            default = f.default_factory()
        else:
            default = dataclasses.MISSING
        node = _node_class(hints[f.name])
        if node is None:
            yield ConfigField(path, cls, hints[f.name], default)
        else:
            yield from _walk(node, None if default is dataclasses.MISSING else default, path + ".", skip)


def _node_class(hint: Any) -> type | None:
    """The dataclass a field's annotation names, when it is a node of a nested config."""
    return hint if isinstance(hint, type) and dataclasses.is_dataclass(hint) else None


def _paths(cls: type, prefix: str = "") -> set[str]:
    """Every field path of `cls`, nodes and leaves."""
    found, hints = set(), typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        found.add(prefix + f.name)
        node = _node_class(hints[f.name])
        if node is not None:
            found |= _paths(node, f"{prefix}{f.name}.")
    return found


def add_config_arguments(
    parser: argparse.ArgumentParser | argparse._ArgumentGroup,
    cls: type,
    *,
    exclude: Iterable[str] = (),
    rename: Mapping[str, str | tuple[str, ...]] | None = None,
    parse: Mapping[str, Callable[[str], Any]] | None = None,
    unset: bool = False,
) -> None:
    """One flag per field of dataclass `cls`, except `exclude`; a nested dataclass's fields are flags too (in a group
    of their own), named by their own field names, with the defaults the parent's default gives them.

    exclude, rename and parse name fields by their path from `cls` ('tasks', 'fleet.tasks'). rename: field -> its
    flag, or flags (the first is shown, the others are aliases), where the derived `--field-name` is not the one in
    use. parse: field -> a function of the flag's text to the value, instead of the annotation's (e.g. task lists
    that accept aliases). unset: every flag defaults to None, nothing is required, for flags that override values
    held elsewhere (a recipe file): `config_values` then holds None for the flags not given.
    """
    rename, parse = rename or {}, parse or {}
    fields = config_fields(cls, exclude)
    unknown = (set(rename) | set(parse)) - {f.path for f in fields}
    if unknown:
        raise ValueError(f"{cls.__name__} has no flag fields {sorted(unknown)}")
    groups: dict[str, argparse.ArgumentParser | argparse._ArgumentGroup] = {"": parser}
    for f in fields:
        node = f.path.rpartition(".")[0]
        if node not in groups:
            if unset:
                raise TypeError(f"{cls.__name__}.{f.path}: a nested config's flags cannot be unset")
            groups[node] = _group(parser, cls, node)
        flags = _flags(f, rename)
        kwargs = _argument_kwargs(f.owner, f.name, f.hint, parse.get(f.path))
        if unset:
            kwargs["default"] = None
        elif f.default is not dataclasses.MISSING:
            kwargs["default"] = f.default
        else:
            kwargs["required"] = True
        if "action" not in kwargs and "choices" not in kwargs:  # choices show themselves
            kwargs.setdefault("metavar", flags[0].lstrip("-").replace("-", "_").upper())
        # '%' would be read as a format specifier by argparse.
        doc = field_docs(f.owner).get(f.name)
        help_text = doc.replace("%", "%%") if doc else None
        action = groups[node].add_argument(*flags, dest=f"{cls.__name__}.{f.path}", help=help_text, **kwargs)
        action.help = help_text  # some Pythons' BooleanOptionalAction append their own "(default: ...)"


def _group(parser: argparse.ArgumentParser | argparse._ArgumentGroup, cls: type, node: str) -> Any:
    """The argument group of a node's flags (a group already given: that one; argparse groups do not nest)."""
    if not isinstance(parser, argparse.ArgumentParser):
        return parser
    *above, name = node.split(".")
    parent = cls
    for part in above:
        parent = typing.get_type_hints(parent)[part]
    hint = typing.get_type_hints(parent)[name]
    return parser.add_argument_group(f"{node} ({hint.__module__}.{hint.__name__})", field_docs(parent).get(name))


def _flags(f: ConfigField, rename: Mapping[str, str | tuple[str, ...]]) -> tuple[str, ...]:
    flags = rename.get(f.path, "--" + f.name.replace("_", "-"))
    return (flags,) if isinstance(flags, str) else tuple(flags)


def config_values(namespace: argparse.Namespace, cls: type) -> dict[str, Any]:
    """The parsed values of `cls`'s flags, by field name; a node's as its dataclass, its flags' values on top of
    its default (so its fields that are no flags keep their default)."""
    prefix = cls.__name__ + "."
    flat = {k.removeprefix(prefix): v for k, v in vars(namespace).items() if k.startswith(prefix)}
    return _assemble(cls, flat, None)


def _assemble(cls: type, flat: dict[str, Any], instance: Any) -> dict[str, Any]:
    values, hints = {}, typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if f.name in flat:
            values[f.name] = flat[f.name]
            continue
        node = _node_class(hints[f.name])
        inner = {k.removeprefix(f.name + "."): v for k, v in flat.items() if k.startswith(f.name + ".")}
        if node is None or not inner:
            continue
        if instance is not None:
            default = getattr(instance, f.name)
        elif f.default_factory is not dataclasses.MISSING:
            default = f.default_factory()
        else:
            default = None if f.default is dataclasses.MISSING else f.default
        given = _assemble(node, inner, default)
        values[f.name] = node(**given) if default is None else dataclasses.replace(default, **given)
    return values


class ConfigError(ValueError):
    """A config refused the values its flags parsed into (its own check, in __post_init__): a usage error."""


def config_from(namespace: argparse.Namespace, cls: type, **extra: Any) -> Any:
    """`cls` from its parsed flags; `extra` supplies (or replaces) fields that are not flags. A value the config
    (or a node of it) refuses raises ConfigError, which the CLI reports as a usage error (exit 2)."""
    try:
        return cls(**{**config_values(namespace, cls), **extra})
    except ValueError as error:
        raise ConfigError(str(error)) from None


def config_argv(
    config: Any, *, exclude: Iterable[str] = (), rename: Mapping[str, str | tuple[str, ...]] | None = None
) -> list[str]:
    """The inverse of the parser: the flags that `add_config_arguments(parser, type(config), exclude=..., rename=...)`
    parses back into `config` (every field, defaults included: a child's command line says all it runs with).
    A field with a `parse` override must accept the text written here (a comma list, for tuples)."""
    argv = []
    for f in config_fields(config, exclude):
        flag, value = _flags(f, rename or {})[0], f.default
        hint, optional = _unwrap_optional(f.hint)
        if hint is bool:  # --x / --no-x, never 'none'
            if value is None:
                raise TypeError(f"{type(config).__name__}.{f.path} is None but takes --x / --no-x only")
            argv.append(flag if value else "--no-" + flag.removeprefix("--"))
        elif value is None:
            if not optional:
                raise TypeError(f"{type(config).__name__}.{f.path} is None but takes no 'none'")
            argv.append(f"{flag}=none")
        elif isinstance(value, tuple):
            items = [str(v) for v in value]
            if any("," in item for item in items):
                raise ValueError(f"{type(config).__name__}.{f.path}: an item holds a comma: {value}")
            argv.append(f"{flag}={','.join(items)}")
        else:
            argv.append(f"{flag}={value}")  # `=`: a value that starts with '-' is not read as a flag
    return argv


def config_classes(cls: type) -> list[type]:
    """`cls` and every dataclass nested in it, each once: the classes of one nested config."""
    found = [cls]
    for name, hint in typing.get_type_hints(cls).items():
        node = _node_class(hint)
        if node is not None and name in {f.name for f in dataclasses.fields(cls)}:
            found += [c for c in config_classes(node) if c not in found]
    return found


def declared_defaults(cls: type) -> dict[str, Any]:
    """Each field's default as its class declares it (a default_factory called; required fields absent), of a
    dataclass or a pydantic model."""
    if dataclasses.is_dataclass(cls):
        found = {}
        for f in dataclasses.fields(cls):
            if f.default is not dataclasses.MISSING:
                found[f.name] = f.default
            elif f.default_factory is not dataclasses.MISSING:
                found[f.name] = f.default_factory()
        return found
    fields = getattr(cls, "model_fields", None)  # pydantic
    if fields is None:
        raise TypeError(f"{cls.__name__} is neither a dataclass nor a pydantic model")
    return {name: f.get_default(call_default_factory=True) for name, f in fields.items() if not f.is_required()}


def conflicting_defaults(classes: Iterable[type]) -> dict[str, dict[str, Any]]:
    """The field names declared in more than one of `classes` with different defaults: name -> {class: default}.
    One setting, one default: where a run wants another value than a part's own, the run's tree says so (a node's
    default), it does not declare the setting again."""
    by_name: dict[str, dict[str, Any]] = {}
    for cls in classes:
        for name, default in declared_defaults(cls).items():
            by_name.setdefault(name, {})[cls.__name__] = default
    return {
        name: declared
        for name, declared in sorted(by_name.items())
        if any(not _same(v, w) for v in declared.values() for w in declared.values())
    }


def _same(a: Any, b: Any) -> bool:
    try:
        return bool(a == b)
    except Exception:  # noqa: BLE001 - values whose == raises (arrays ...) are different enough
        return False


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
    try:
        hint, optional = _unwrap_optional(hint)
    except TypeError:
        raise TypeError(f"{cls.__name__}.{name}: {hint} has no flag type; pass parse= or exclude it") from None
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


def _unwrap_optional(hint: Any) -> tuple[Any, bool]:
    """(T, True) of `T | None`, (hint, False) of anything else; a union of more types has no flag type."""
    if typing.get_origin(hint) not in (typing.Union, types.UnionType):
        return hint, False
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    if len(args) != 1:
        raise TypeError(f"{hint} has no flag type")
    return args[0], True


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
