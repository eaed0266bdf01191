# Shared by the setup_*.sh scripts (sourced, not run): one venv per external tool, reused when present.
# Before sourcing: ROOT, VENV, PYTHON, and LOG_NAME (the prefix of the log lines).

log() { printf '[%s] %s\n' "$LOG_NAME" "$*" >&2; }

UV_VERSION="${UV_VERSION:-0.13.9}"

# Set UV to a uv executable: $UV when it runs already, else uv==$UV_VERSION installed once with pip
# into <repo>/.cache/uv-venv (git-ignored). uv installs what pip would, about 3x faster (vLLM's CPU
# build: 23 s instead of 70 s on CI's 2-core VM, BENCHMARKS.md). EAGLE3_NO_UV=1, or no way to get
# it, leaves UV empty: pip installs.
ensure_uv() {
    if [[ -n "${EAGLE3_NO_UV:-}" ]]; then UV=""; return; fi
    if [[ -n "${UV:-}" ]] && "$UV" --version >/dev/null 2>&1; then return; fi
    local tool="$ROOT/.cache/uv-venv"
    if [[ ! -x "$tool/bin/uv" ]]; then
        mkdir -p "$ROOT/.cache"
        if ! { "$PYTHON" -m venv "$tool" && "$tool/bin/python" -m pip install --quiet "uv==$UV_VERSION"; } >&2; then
            log "uv==$UV_VERSION could not be installed; pip installs instead"
            UV=""
            export EAGLE3_NO_UV=1  # the scripts this one starts do not try again
            return
        fi
    fi
    UV="$tool/bin/uv"
}

# Create $VENV with $PYTHON unless it exists; sets VPY to its interpreter (and UV, ensure_uv).
ensure_venv() {
    ensure_uv
    if [[ ! -x "$VENV/bin/python" ]]; then
        log "creating venv $VENV with $PYTHON ($("$PYTHON" --version 2>&1))"
        "$PYTHON" -m venv "$VENV"
        if [[ -z "$UV" ]]; then
            "$VENV/bin/python" -m pip install --quiet --upgrade pip
        fi
    else
        log "reusing venv $VENV"
    fi
    VPY="$VENV/bin/python"
}

# `pip install ARGS` into $VPY, through uv when there is one. uv reads no pip configuration: it gets
# the find-links directories pip's environment names (PIP_FIND_LINKS, e.g. a local torch wheel), and
# considers every index for each package as pip does. It byte-compiles as pip does (where
# PYTHONDONTWRITEBYTECODE is set, every import would compile again otherwise). Where uv cannot
# resolve or install what it is asked (an index only pip.conf names, say), pip does it.
venv_install() {
    if [[ -n "${UV:-}" ]]; then
        local links=() dir
        for dir in ${PIP_FIND_LINKS:-}; do links+=(--find-links "$dir"); done
        if "$UV" pip install --quiet --python "$VPY" --compile-bytecode --index-strategy unsafe-best-match \
                ${links[@]+"${links[@]}"} "$@"; then
            return 0
        fi
        log "uv could not install this (see above); pip does"
    fi
    "$VPY" -m pip install --quiet "$@"
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

# `venv_install` with the project's constraints and, where TORCH_INDEX_URL is set, the extra index
# that holds the torch==2.13.0+cpu wheel pip does not already see.
constrained_install() {
    local extra=()
    if [[ -n "${TORCH_INDEX_URL:-}" ]]; then
        extra+=(--extra-index-url "$TORCH_INDEX_URL")
    fi
    venv_install -c "$ROOT/constraints.txt" ${extra[@]+"${extra[@]}"} "$@"
}

# PyPI's torchvision / torchaudio / torchcodec are CUDA-linked and break torch+cpu: remove any that
# an install pulled in (every run, so a venv that once got one is mended).
remove_cuda_linked_media() {
    local pkg
    for pkg in torchvision torchaudio torchcodec; do
        if "$VPY" -m pip show --quiet "$pkg" >/dev/null 2>&1; then
            log "uninstalling $pkg (CUDA-linked on PyPI; breaks torch+cpu)"
            "$VPY" -m pip uninstall --yes --quiet "$pkg"
        fi
    done
}
