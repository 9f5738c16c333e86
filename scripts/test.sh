#!/usr/bin/env bash
# The one test command: lint (ruff) and types (mypy; both configured in pyproject.toml) once, then
# pytest with any arguments on each supported stack (scripts/stacks/: oldest = Python 3.11 + jax
# 0.10.2, current = Python 3.12 + jax 0.12.0.1 + jax-triton 0.4.1, current-py313 = the same on Python
# 3.13), each in its own venv built from nothing if needed (scripts/setup_env.sh).
# KERNEL_CACHE_STACKS="oldest" (or any of them, space-separated) runs those only;
# KERNEL_CACHE_SKIP_LINT=1 skips the checks (a quick `-k` loop while editing).
# GPU tests (marked `gpu`) run where `nvidia-smi -L` lists a GPU and are skipped elsewhere; each run
# ends with a line saying which, and why (tests/conftest.py). JAX_PLATFORMS is left as you set it.
# Exit status: 0 when every stack passed; otherwise the first failing stack's pytest status.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
STACKS="${KERNEL_CACHE_STACKS:-oldest current current-py313}"
# The remote-level tests need a real redis-server: installed from Debian's packages where missing and
# this runs as root (as .ci/run does); elsewhere they skip with the reason.
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null && ! command -v redis-server >/dev/null; then
  (timeout 240 apt-get update -qq && DEBIAN_FRONTEND=noninteractive timeout 240 \
     apt-get install -y -qq --no-install-recommends redis-server) >/dev/null 2>&1 \
    || echo "test.sh: redis-server not installed; the remote-level tests will skip" >&2
fi
status=0
summary=()
linted=0
for stack in $STACKS; do
  echo "test.sh: === the $stack stack ===" >&2
  set +e  # the stack's status is collected below; inside, every step must pass (set -e again)
  (
    set -euo pipefail
    export KERNEL_CACHE_STACK="$stack"
    source "$ROOT/scripts/setup_env.sh"
    echo "test.sh: $("$VENV/bin/python" -c 'import sys, jax, jaxlib, triton; print("Python %d.%d.%d" % sys.version_info[:3], "jax", jax.__version__, "jaxlib", jaxlib.__version__, "triton", triton.__version__)')" >&2
    if [ "${KERNEL_CACHE_SKIP_LINT:-0}" != "1" ] && [ "$linted" = 0 ]; then
      echo "test.sh: ruff check" >&2
      python -m ruff check . --output-format concise
      echo "test.sh: mypy (strict: kernel_cache, compiler, lowering, scripts)" >&2
      python -m mypy --no-error-summary
    fi
    set +e
    python -m pytest "$@"
    rc=$?
    set -e
    if [ "$rc" -eq 5 ]; then
      echo "test.sh: pytest collected no tests on the $stack stack" >&2
      exit 1
    fi
    exit "$rc"
  )
  rc=$?
  set -e
  linted=1
  if [ "$rc" = 0 ]; then summary+=("$stack: passed"); else summary+=("$stack: FAILED (exit $rc)"); fi
  if [ "$rc" != 0 ] && [ "$status" = 0 ]; then status=$rc; fi
done
echo "test.sh: ${summary[*]}" >&2
exit "$status"
