#!/usr/bin/env bash
# Create the three environments the tests need, side by side: `.venv` (this project with its test
# extras), `.vllm-venv` (vLLM's CPU build, scripts/setup_vllm_cpu.sh) and `.sglang-venv` (SGLang
# on CPU, scripts/setup_sglang_cpu.sh), then run the tests with the first:
#
#   scripts/setup_test_envs.sh && .venv/bin/python -m pytest
#
# Each install is mostly one installer unpacking and byte-compiling wheels, so the three together
# take little more than the longest one. uv installs them when it can be had (scripts/venv_common.sh:
# 48 s for the first two instead of 70 s with pip on CI's 2-core VM, BENCHMARKS.md); pip otherwise.
# Byte-compiling stays on: where PYTHONDONTWRITEBYTECODE is set (this project's machines), modules
# the installer did not compile are compiled again by every interpreter that imports them.
# Environment: PYTHON (default python3), EAGLE3_NO_UV=1 (pip only), and what scripts/setup_vllm_cpu.sh
# and scripts/setup_sglang_cpu.sh read.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PYTHON="${PYTHON:-python3}"
START=$(date +%s)

VENV="$ROOT/.venv"
LOG_NAME=setup_test_envs
# shellcheck source=scripts/venv_common.sh
source "$ROOT/scripts/venv_common.sh"
ensure_uv  # once, before the three installs use it
export UV

"$ROOT/scripts/setup_vllm_cpu.sh" >/dev/null &
vllm_setup=$!
"$ROOT/scripts/setup_sglang_cpu.sh" >/dev/null &
sglang_setup=$!
# Whichever step fails first ends this script (set -e); the trap stops the setups still running.
trap 'kill "$vllm_setup" "$sglang_setup" 2>/dev/null || true' EXIT

ensure_venv
venv_install -c "$ROOT/constraints.txt" -e "$ROOT[test]"

# One wait per job: `wait` with several ids returns the last one's status only, so a failure of the
# other would pass unseen. Each exit status here is this script's (set -e).
wait "$vllm_setup"
wait "$sglang_setup"
trap - EXIT
log ".venv, .vllm-venv and .sglang-venv ready in $(( $(date +%s) - START )) s"
