#!/usr/bin/env bash
# Regenerates the dependency locks in ops/lock/ from pyproject.toml (run after changing a dependency range):
#   all.txt                      every extra together: what ops/setup.sh installs for the CLI and the tests
#   edge.txt processors.txt learner.txt
#                                one extra each (plus the base dependencies), constrained to all.txt so a
#                                package has the same version in every lock
# The locks are for CPython 3.11 on x86_64 Linux, the machine this project runs on.
set -euo pipefail
cd "$(dirname "$0")/.."
UV_VERSION=0.13.9
command -v uv >/dev/null || python3 -m pip install -q "uv==$UV_VERSION"
target=(--python-version 3.11 --python-platform x86_64-unknown-linux-gnu --no-header --quiet)
uv pip compile pyproject.toml --extra all "${target[@]}" -o ops/lock/all.txt
for extra in edge processors learner; do
  uv pip compile pyproject.toml --extra "$extra" -c ops/lock/all.txt "${target[@]}" -o "ops/lock/$extra.txt"
done
echo "locks written: $(ls ops/lock)"
