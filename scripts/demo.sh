#!/usr/bin/env bash
# The main job: set up .venv if needed, then run the kernel-cache demo (its own cache dir,
# .kernel-cache/demo by default; no server). Runs from the caller's directory, so --dir is relative to it.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$ROOT/scripts/setup_env.sh"
exec python "$ROOT/scripts/demo.py" "$@"
