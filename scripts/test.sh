#!/usr/bin/env bash
# The one test command: sets up .venv from nothing if needed, checks lint (ruff) and types (mypy,
# strict on kernel_cache and compiler; both configured in pyproject.toml), then runs pytest with
# any arguments. KERNEL_CACHE_SKIP_LINT=1 skips the checks (a quick `-k` loop while editing).
# GPU tests (marked `gpu`) run where `nvidia-smi -L` lists a GPU and are skipped elsewhere; the run
# ends with a line saying which, and why (tests/conftest.py). JAX_PLATFORMS is left as you set it.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$ROOT/scripts/setup_env.sh"
cd "$ROOT"
if [ "${KERNEL_CACHE_SKIP_LINT:-0}" != "1" ]; then
  echo "test.sh: ruff check" >&2
  python -m ruff check . --output-format concise
  echo "test.sh: mypy (strict: kernel_cache, compiler)" >&2
  python -m mypy --no-error-summary
fi
set +e
python -m pytest "$@"
rc=$?
set -e
if [ "$rc" -eq 5 ]; then
  echo "test.sh: pytest collected no tests" >&2
  exit 1
fi
exit "$rc"
