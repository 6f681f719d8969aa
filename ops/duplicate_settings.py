"""List every config field name declared in more than one config class with different defaults.

Usage (in the venv, from the repository root):

    python ops/duplicate_settings.py         every config class of the repository: the dataclasses and pydantic
                                             models whose names end in Config or Settings, found in the source,
                                             then imported (the learner's import torch: some seconds)
    python ops/duplicate_settings.py --run   the classes of one run only: `flywheel demo`'s nested config and
                                             `flywheel chaos`'s; exit 1 when one is declared twice there

One setting, one default (flywheel.run.config): within a run a name declared twice with different defaults is two
knobs a newcomer must find and keep in step, and tests/test_run_config.py fails on it. Across commands (each bench's
`--out`, each tool's `--seed`) a name may well mean another thing: the full list is for reading, not a failure.
"""

from __future__ import annotations

import argparse
import ast
import importlib
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("schemas", "core", "streams", "registry", "policy", "lake", "edge_client", "processors", "learner",
            "flywheel")  # fmt: skip


def config_class_names() -> list[tuple[str, str]]:
    """(module, class) of every top-level class named *Config or *Settings in the packages."""
    found = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            module = ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
            for node in ast.parse(path.read_text(), filename=str(path)).body:
                if isinstance(node, ast.ClassDef) and node.name.endswith(("Config", "Settings")):
                    found.append((module, node.name))
    return found


def repository_classes() -> list[type]:
    from core.cli_config import declared_defaults

    classes = []
    for module, name in config_class_names():
        cls = getattr(importlib.import_module(module), name)
        try:
            declared_defaults(cls)
        except TypeError:  # neither a dataclass nor a pydantic model
            continue
        classes.append(cls)
    return classes


def run_trees() -> dict[str, list[type]]:
    """The classes of each run's nested config."""
    from core.cli_config import config_classes
    from flywheel.chaos.run import ChaosConfig
    from flywheel.run.config import DemoConfig

    return {"flywheel demo": config_classes(DemoConfig), "flywheel chaos": config_classes(ChaosConfig)}


def show(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def report(title: str, classes: list[type]) -> int:
    from core.cli_config import conflicting_defaults

    duplicated = conflicting_defaults(classes)
    print(f"{title}: {len(duplicated)} field names declared in more than one of {len(classes)} config classes with "
          f"different defaults")  # fmt: skip
    for name, declared in duplicated.items():
        print(f"  {name}: " + ", ".join(f"{cls} {show(default)}" for cls, default in declared.items()))
    return len(duplicated)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run", action="store_true", help="only the classes of one run; exit 1 when any")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    if args.run:
        return 1 if sum(report(name, classes) for name, classes in run_trees().items()) else 0
    report("the repository", repository_classes())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
