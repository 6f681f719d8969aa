# Sourced by flywheel.sh and ops/setup.sh: where the environment for a lock lives.
# A venv outside the clone, named by the lock's digest, so every checkout with the same lock shares it and a
# changed lock gets a fresh one. FLYWHEEL_LOCK picks the lock (all | edge | processors | learner).
FLYWHEEL_LOCK=${FLYWHEEL_LOCK:-all}
FLYWHEEL_LOCK_FILE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/lock/$FLYWHEEL_LOCK.txt"
FLYWHEEL_VENV_ROOT=${FLYWHEEL_VENV_ROOT:-$HOME/.cache/flywheel/venvs}
_lock_digest=$(sha256sum "$FLYWHEEL_LOCK_FILE" | cut -c1-12)
FLYWHEEL_VENV=${FLYWHEEL_VENV:-$FLYWHEEL_VENV_ROOT/$FLYWHEEL_LOCK-$_lock_digest}
export FLYWHEEL_LOCK FLYWHEEL_LOCK_FILE FLYWHEEL_VENV
