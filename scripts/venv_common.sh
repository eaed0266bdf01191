# Shared by the setup_*.sh scripts (sourced, not run): one venv per external tool, reused when present.
# Before sourcing: VENV, PYTHON, and LOG_NAME (the prefix of the log lines).

log() { printf '[%s] %s\n' "$LOG_NAME" "$*" >&2; }

# Create $VENV with $PYTHON unless it exists; sets VPY to its interpreter.
ensure_venv() {
    if [[ ! -x "$VENV/bin/python" ]]; then
        log "creating venv $VENV with $PYTHON ($("$PYTHON" --version 2>&1))"
        "$PYTHON" -m venv "$VENV"
        "$VENV/bin/python" -m pip install --quiet --upgrade pip
    else
        log "reusing venv $VENV"
    fi
    VPY="$VENV/bin/python"
}

# The installed version of distribution $1 in the venv, or nothing.
installed_version() {
    "$VPY" - "$1" <<'PY' 2>/dev/null || true
import sys
from importlib.metadata import PackageNotFoundError, version
try:
    print(version(sys.argv[1]))
except PackageNotFoundError:
    pass
PY
}
