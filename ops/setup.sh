#!/usr/bin/env bash
# Installs what the flywheel needs and is missing; cheap when everything is already there.
#   Debian: chromium + chromium-driver (MiniWoB++), prometheus (promtool)
#   Python: this project with all optional groups (torch comes from PyPI once, then pip's cache)
#   Maven:  the Kafka jars are resolved by `flywheel kafka up` on first use (streams/broker.py)
set -euo pipefail
cd "$(dirname "$0")/.."

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

PYTHON=${PYTHON:-python3}
if ! "$PYTHON" - <<'PY' 2>/dev/null
import importlib.metadata as md, faust, uvloop, deltalake, polars, torch, onnxruntime, miniwob, kafka, pytest  # noqa
md.version("flywheel")
import flywheel.cli  # noqa: the checkout in use is the installed one
PY
then
  echo "[setup] pip install -e .[all]"
  "$PYTHON" -m pip install -q -e ".[all]"
fi
