#!/usr/bin/env bash
# The main job: set up a stack's venv if needed, then run the kernel-cache demo (its own cache dir,
# .kernel-cache/demo by default; no server). The stack is the one of the Python found
# (scripts/stacks/python.sh): the current one (.venv-current) where Python 3.12 is found, else
# current-py313 (3.13), else oldest (3.11, .venv); PYTHON=/path/to/python3.X picks by its version,
# KERNEL_CACHE_STACK=NAME by name. The first line says which stack runs; `--which-stack` prints that
# line alone and installs nothing. Runs from the caller's directory, so --dir is relative to it.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$ROOT/scripts/stacks/python.sh"
choose_stack "demo: " || exit 2
STACK="$CHOSEN_STACK"
echo "kernel-cache demo on $(describe_stack "$STACK" "$ROOT" "$CHOSEN_WHY")"
if [ "${1:-}" = "--which-stack" ]; then exit 0; fi
export KERNEL_CACHE_STACK="$STACK"
source "$ROOT/scripts/setup_env.sh"
exec python "$ROOT/scripts/demo.py" "$@"
