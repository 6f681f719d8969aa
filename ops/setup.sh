#!/usr/bin/env bash
# Installs what the flywheel needs; cheap when everything is already there.
#   Debian: chromium + chromium-driver (MiniWoB++), prometheus (promtool), Java 17 and Maven (Kafka)
#   Python: a venv outside the clone built from the lock ops/lock/$FLYWHEEL_LOCK.txt (default: all), then this
#           checkout installed into it (editable, no dependencies). Drift (a package missing, extra or at another
#           version than the lock) is reported and fixed with `uv pip sync`. Bytecode is compiled at install, since
#           Python writes none at import where PYTHONDONTWRITEBYTECODE is set.
#   Maven:  the Kafka jars are resolved by `flywheel kafka up` on first use (streams/broker/jars.py)
set -euo pipefail
cd "$(dirname "$0")/.."
source ops/venv.sh
UV_VERSION=0.13.9

need_apt=()
command -v chromium >/dev/null || need_apt+=(chromium)
command -v chromedriver >/dev/null || need_apt+=(chromium-driver)
command -v promtool >/dev/null || need_apt+=(prometheus)
command -v mvn >/dev/null || need_apt+=(maven)
command -v java >/dev/null || need_apt+=(openjdk-17-jre-headless)
if [ ${#need_apt[@]} -gt 0 ]; then
  echo "[setup] apt-get install ${need_apt[*]}"
  apt-get update -q
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${need_apt[@]}"
fi

PY=$FLYWHEEL_VENV/bin/python
if [ ! -x "$PY" ]; then
  echo "[setup] new environment $FLYWHEEL_VENV from ops/lock/$FLYWHEEL_LOCK.txt"
  mkdir -p "$(dirname "$FLYWHEEL_VENV")"
  python3 -m venv "$FLYWHEEL_VENV"
fi
"$PY" -m pip --version >/dev/null 2>&1 || "$PY" -m ensurepip -q
[ "$("$PY" -m uv --version 2>/dev/null | cut -d' ' -f2)" = "$UV_VERSION" ] || "$PY" -m pip install -q "uv==$UV_VERSION"

# Drift: compare every installed distribution with the lock (this project itself excluded).
if ! "$PY" ops/lock_drift.py "$FLYWHEEL_LOCK_FILE"; then
  echo "[setup] uv pip sync ops/lock/$FLYWHEEL_LOCK.txt"
  "$PY" -m uv pip sync --python "$PY" --quiet --compile-bytecode "$FLYWHEEL_LOCK_FILE"
  "$PY" -m pip --version >/dev/null 2>&1 || "$PY" -m ensurepip -q
  "$PY" -m uv --version >/dev/null 2>&1 || "$PY" -m pip install -q "uv==$UV_VERSION"
fi

# Bytecode for every installed module, compiled once here: where PYTHONDONTWRITEBYTECODE is set (this box sets it)
# Python writes none at import, so every process compiled torch, transformers and the rest from source again
# (importing them took 7-10 s a process instead of 3 s; the suite starts a few hundred processes).
if [ ! -e "$FLYWHEEL_VENV/.bytecode-compiled" ]; then
  echo "[setup] compile the environment's bytecode"
  "$PY" -m compileall -q -j 0 "$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" >/dev/null \
    || true  # a few packages ship files that are not Python 3 (templates, tests); their modules still import
  touch "$FLYWHEEL_VENV/.bytecode-compiled"
fi

# This checkout, editable and without dependencies (the lock provides them); re-pointed when another clone
# of the project used the same environment last. -I: without it the current directory (this checkout) is on
# sys.path and the check passes in a venv that does not have the project installed.
if [ "$("$PY" -I -c 'import flywheel, pathlib; print(pathlib.Path(flywheel.__file__).resolve().parents[1])' 2>/dev/null)" != "$PWD" ]; then
  echo "[setup] install this checkout ($PWD) into $FLYWHEEL_VENV"
  "$PY" -m uv pip install --python "$PY" --quiet --no-deps -e .
fi
