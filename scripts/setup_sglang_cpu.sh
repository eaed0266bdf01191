#!/usr/bin/env bash
# Create (or re-check) the Python environment the SGLang CPU server runs in.
#
#   scripts/setup_sglang_cpu.sh [VENV]        # default: <repo>/.sglang-venv (git-ignored)
#
# SGLang runs in its own venv, as vLLM does (docs/design.md, 'Backends and servers'): the server
# is a separate process started with `<VENV>/bin/python -m sglang.launch_server`. The `sglang`
# wheel on PyPI requires CUDA-only packages (flashinfer, sglang-kernel, cuda-python, nvidia-*,
# torch 2.14.1), so on a CPU machine it is installed with --no-deps beside the packages its
# imports need, each pinned below, with torch pinned to `2.13.0+cpu` and transformers < 5.20
# through the project's constraints.txt. What else the CPU engine needs:
#   * `SGLANG_USE_CPU_ENGINE=1` in the server's environment with `--device cpu` (without it the
#     rotary code imports vllm);
#   * a `sgl_kernel` package: the CPU path imports ops from it on every server
#     (`copy_all_layer_kv_cache_cpu`, `assign_req_to_token_pool_cpu`, and the speculative ones)
#     and PyPI's sgl-kernel holds CUDA libraries only. This script copies the pure-Python
#     stand-in eagle3/serving/sglang_cpu_kernel.py into this venv's site-packages only;
#   * a `torchvision` that imports: SGLang's model configs import torchvision.transforms for
#     every model, and PyPI's torchvision is a CUDA build that fails to import against CPU torch
#     ("operator torchvision::nms does not exist"). The import-only stand-in
#     eagle3/serving/sglang_cpu_torchvision.py goes into this venv's site-packages only;
#   * no torchvision / torchaudio / torchcodec distributions from PyPI (CUDA-linked).
# A GPU machine installs `sglang` with its own dependencies and gets neither stand-in.
#
# Environment:
#   PYTHON           interpreter to create the venv with (default: python3; SGLang needs >= 3.11)
#   SGLANG_VERSION   default 0.5.23 (the pins below are the ones that import with it)
#   TORCH_INDEX_URL  extra index for the torch==2.13.0+cpu wheel where pip does not already see
#                    it (e.g. https://download.pytorch.org/whl/cpu); unset = pip's own config
#
# Idempotent: an existing venv is reused; the install is skipped when the right sglang already
# imports; the unwanted packages are removed and the stand-ins refreshed on every run.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${1:-${SGLANG_VENV:-$ROOT/.sglang-venv}}"
PYTHON="${PYTHON:-python3}"
SGLANG_VERSION="${SGLANG_VERSION:-0.5.23}"
CONSTRAINTS="$ROOT/constraints.txt"
START=$(date +%s)

# What sglang's imports need on the CPU path (plus the server's HTTP stack), at the versions
# checked with sglang 0.5.23; the pins sglang's own metadata fixes are kept where it has them.
SGLANG_CPU_DEPS=(
    "torch==2.13.0+cpu" "transformers==5.19.0" "tokenizers==0.23.2" "triton==3.9.0"
    "safetensors==0.8.0" "huggingface-hub==1.33.0" "numpy==2.4.6" "scipy==1.17.1"
    "einops==0.8.2" "compressed-tensors==0.18.0" "apache-tvm-ffi==0.1.11" "xgrammar==0.2.7"
    "gguf==0.19.0" "sentencepiece==0.2.1" "tiktoken==0.14.0" "soundfile==0.13.1"
    "pillow==13.0.0" "fastapi==0.165.0" "uvicorn==0.55.0" "uvloop==0.23.0" "aiohttp==3.14.5"
    "requests==2.34.2" "python-multipart==0.0.34" "orjson==3.13.0" "pyzmq==27.3.0"
    "msgspec==0.23.0" "pybase64==1.5.1" "pydantic==2.14.4" "partial-json-parser==0.2.1.1.post7"
    "interegular==0.3.3" "jsonschema==4.26.0" "openai==2.8.0" "ipython==9.19.1" "dill==0.4.1"
    "psutil==7.2.2" "setproctitle==1.3.8" "prometheus-client==0.26.0" "xxhash==4.1.0"
    "tqdm==4.70.1" "packaging==26.4" "regex==2026.12.2"
)

LOG_NAME=setup_sglang_cpu
# shellcheck source=scripts/venv_common.sh
source "$ROOT/scripts/venv_common.sh"
ensure_venv

sglang_imports() {
    SGLANG_USE_CPU_ENGINE=1 "$VPY" -c "import sglang.srt.entrypoints.http_server" >/dev/null 2>&1
}

if [[ "$(installed_version sglang)" == "$SGLANG_VERSION" ]] && sglang_imports; then
    log "sglang $SGLANG_VERSION already installed"
else
    log "installing sglang==$SGLANG_VERSION's CPU dependencies (constraints: $CONSTRAINTS)"
    constrained_install "${SGLANG_CPU_DEPS[@]}"
    log "installing sglang==$SGLANG_VERSION without its (CUDA) dependencies"
    venv_install --no-deps "sglang==$SGLANG_VERSION"
fi

# CUDA-linked builds from PyPI break the CPU torch; the torchvision stand-in below replaces one.
remove_cuda_linked_media

SITE="$("$VPY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"

# Copy the stand-in $1 (a file of this repo) to $SITE/$2/__init__.py unless a distribution named in
# $3.. is installed or $SITE/$2 holds something that is not this stand-in.
install_stand_in() {
    local file="$1" package="$2" dist
    shift 2
    for dist in "$@"; do
        if [[ -n "$(installed_version "$dist")" ]]; then
            log "error: $dist is installed in $VENV; the CPU stand-in for $package is not put beside it"
            exit 1
        fi
    done
    local target="$SITE/$package/__init__.py"
    if [[ -e "$SITE/$package" ]] && ! grep -q '^EAGLE3_CPU_STAND_IN = True' "$target" 2>/dev/null; then
        log "error: $SITE/$package is not eagle3's stand-in; remove it or use another venv"
        exit 1
    fi
    if ! cmp -s "$ROOT/$file" "$target"; then
        log "installing $file as $package (this venv only)"
        mkdir -p "$SITE/$package"
        cp "$ROOT/$file" "$target.tmp" && mv "$target.tmp" "$target"
        "$VPY" -m compileall -q "$SITE/$package" >/dev/null
    fi
}
install_stand_in eagle3/serving/sglang_cpu_kernel.py sgl_kernel sgl-kernel sglang-kernel
install_stand_in eagle3/serving/sglang_cpu_torchvision.py torchvision torchvision

log "checking the install"
SGLANG_USE_CPU_ENGINE=1 "$VPY" - <<'EOF'
import sys
import warnings
from importlib.metadata import version

warnings.simplefilter("ignore")  # SGLang warns at import that AWQ/GGUF need CUDA

import sgl_kernel
import torch
import torchvision
import transformers
import sglang.srt.entrypoints.http_server  # noqa: F401  (the server's modules import)
import sglang.srt.managers.scheduler  # noqa: F401

tv = tuple(int(p) for p in transformers.__version__.split(".")[:2])
assert "+cpu" in torch.__version__, f"torch {torch.__version__} is not the CPU build"
assert tv < (5, 20), f"transformers {transformers.__version__} >= 5.20"
assert getattr(sgl_kernel, "EAGLE3_CPU_STAND_IN", False), f"{sgl_kernel.__file__} is not the stand-in"
assert getattr(torchvision, "EAGLE3_CPU_STAND_IN", False), f"{torchvision.__file__} is not the stand-in"
print(f"sglang {version('sglang')}, torch {torch.__version__}, "
      f"transformers {transformers.__version__}, python {sys.version.split()[0]}", file=sys.stderr)
EOF

log "done in $(( $(date +%s) - START )) s; venv size $(du -sh "$VENV" | cut -f1)"
log "serve with: SGLANG_USE_CPU_ENGINE=1 $VPY -m sglang.launch_server --device cpu ..."
echo "$VPY"
