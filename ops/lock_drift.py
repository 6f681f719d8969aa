"""Exit 1 (and say what differs) when the running environment does not match a lock file.

Usage: python ops/lock_drift.py ops/lock/all.txt. Compares normalised distribution names and versions:
missing, at another version, or installed but not in the lock. The project itself and the installers
(pip, uv, setuptools) are not the lock's business.
"""

import importlib.metadata as md
import re
import sys

IGNORED = {"flywheel", "pip", "uv", "setuptools", "wheel"}


def normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def locked(path: str) -> dict[str, str]:
    pins = {}
    with open(path) as lock:
        lines = lock.read().splitlines()
    for line in lines:
        line = line.split("#", 1)[0].strip()
        if "==" in line:
            name, version = line.split("==", 1)
            pins[normalise(name.split("[")[0])] = version.split(";")[0].strip()
    return pins


def installed() -> dict[str, str]:
    return {normalise(d.metadata["Name"]): d.version for d in md.distributions() if d.metadata["Name"]}


def main(path: str) -> int:
    want, have = locked(path), installed()
    drift = [f"missing {n}=={v}" for n, v in sorted(want.items()) if n not in have]
    drift += [f"{n} {have[n]} (lock {v})" for n, v in sorted(want.items()) if n in have and have[n] != v]
    drift += [f"extra {n}=={v}" for n, v in sorted(have.items()) if n not in want and n not in IGNORED]
    if drift:
        shown = drift[:10] + ([f"... and {len(drift) - 10} more"] if len(drift) > 10 else [])
        print(f"[setup] environment differs from {path}: " + "; ".join(shown))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
