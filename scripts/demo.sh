#!/usr/bin/env bash
# The main job: set up .venv if needed, then run the kernel-cache demo (local cache dir, no server).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$ROOT/scripts/setup_env.sh"
cd "$ROOT"
exec python scripts/demo.py "$@"
