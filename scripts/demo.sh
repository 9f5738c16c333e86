#!/usr/bin/env bash
# The main job: set up the current stack's venv (.venv-current) if needed, then run the kernel-cache
# demo (its own cache dir, .kernel-cache/demo by default; no server). KERNEL_CACHE_STACK=oldest runs
# it on the oldest supported stack instead. Runs from the caller's directory, so --dir is relative to it.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export KERNEL_CACHE_STACK="${KERNEL_CACHE_STACK:-current}"
source "$ROOT/scripts/setup_env.sh"
exec python "$ROOT/scripts/demo.py" "$@"
