#!/usr/bin/env bash
# Create (or re-check) the environment the speculators trainer runs in, for the side-by-side.
#
#   scripts/setup_speculators_cpu.sh [VENV]   # default: <repo>/.speculators-venv (git-ignored)
#
# Used by scripts/speculators_side_by_side.py, which trains a speculators Eagle-3 draft on an
# eagle3 chain's data and judges it beside eagle3's own draft. speculators (the vLLM project's
# draft trainer) lives in its own venv, as the vLLM server does: its pins (transformers, datasets,
# loguru, pydantic ...) are not ours.
#
#   * `speculators==0.9.0` and `hs-connectors==0.9.0` with torch pinned to `2.13.0+cpu` through
#     the project's constraints.txt;
#   * installed without their torchvision / torchaudio requirements: speculators imports neither,
#     and PyPI's builds of both are CUDA-linked and break the CPU torch;
#   * on CPU, training needs `--loss-implementation eager` (the fused losses are Triton kernels)
#     and `--draft-attn-impl sdpa`; the side-by-side script passes both.
#
# Environment:
#   PYTHON               interpreter to create the venv with (default: python3; needs >= 3.11)
#   SPECULATORS_VERSION  default 0.9.0
#   TORCH_INDEX_URL      extra index for the torch==2.13.0+cpu wheel where pip does not see it
#
# Idempotent: an existing venv is reused and the install is skipped when the right version imports.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${1:-${SPECULATORS_VENV:-$ROOT/.speculators-venv}}"
PYTHON="${PYTHON:-python3}"
SPECULATORS_VERSION="${SPECULATORS_VERSION:-0.9.0}"
CONSTRAINTS="$ROOT/constraints.txt"
START=$(date +%s)

LOG_NAME=setup_speculators_cpu
# shellcheck source=scripts/venv_common.sh
source "$ROOT/scripts/venv_common.sh"
ensure_venv

if [[ "$(installed_version speculators)" == "$SPECULATORS_VERSION" ]]; then
    log "speculators $SPECULATORS_VERSION already installed"
else
    log "installing speculators==$SPECULATORS_VERSION (constraints: $CONSTRAINTS)"
    # speculators' own requirements, less torchvision/torchaudio (see the header).
    constrained_install \
        "torch==2.13.0+cpu" "transformers>=5.0,<5.20" "datasets>=4.0,<=5.1.0" "loguru>=0.7.2,<=0.7.3" \
        "numpy>=2.0,<=2.5.4" "tqdm>=4.66.3,<=4.70.1" "openai>=2.0" aiohttp click httpx huggingface-hub \
        protobuf psutil "pydantic>=2.0" "pydantic-settings>=2.0" rich safetensors "typer>=0.12" packaging
    venv_install --no-deps "speculators==$SPECULATORS_VERSION" "hs-connectors==$SPECULATORS_VERSION"
fi

log "checking the install"
"$VPY" - <<'EOF'
import sys
from importlib.metadata import version

import torch

import speculators.train.cli  # noqa: F401  (the check: the trainer imports)

assert "+cpu" in torch.__version__, f"torch {torch.__version__} is not the CPU build"
print(f"speculators {version('speculators')}, torch {torch.__version__}, python {sys.version.split()[0]}",
      file=sys.stderr)
EOF
log "done in $(( $(date +%s) - START )) s; venv size $(du -sh "$VENV" | cut -f1)"
echo "$VPY"
