#!/usr/bin/env bash
# The one test command: on one stack (scripts/stacks/: oldest = Python 3.11 + jax 0.10.2, current =
# Python 3.12 + jax 0.12.0.1 + jax-triton 0.4.1, current-py313 = the same on Python 3.13), in its own
# venv built from nothing if needed (scripts/setup_env.sh): lint (ruff) and types (mypy, against that
# stack's packages and Python version; both configured in pyproject.toml), then pytest with any arguments.
# The stack is the demo's (scripts/stacks/python.sh): the active Python's where it is 3.11-3.13, else
# the current one where Python 3.12 is found (PYTHON= or KERNEL_CACHE_STACK= pick another).
# KERNEL_CACHE_STACKS=all runs every stack in turn (what CI runs: .ci/run); KERNEL_CACHE_STACKS="oldest
# current" (space-separated) runs those; KERNEL_CACHE_SKIP_LINT=1 skips the checks (a quick `-k` loop).
# `scripts/test.sh --which-stacks` prints the stacks it would test, and installs and runs nothing.
# GPU tests (marked `gpu`) run where `nvidia-smi -L` lists a GPU and are skipped elsewhere; each run
# ends with a line saying which, and why (tests/conftest.py). JAX_PLATFORMS is left as you set it.
# Exit status: 0 when every stack passed; otherwise the first failing stack's status.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
source "$ROOT/scripts/stacks/python.sh"
STACKS="${KERNEL_CACHE_STACKS:-}"
if [ "$STACKS" = all ]; then STACKS="$ALL_STACKS"; fi
if [ -z "$STACKS" ]; then
  choose_stack "test.sh: " || exit 2
  STACKS="$CHOSEN_STACK"
  echo "test.sh: the $STACKS stack, because $CHOSEN_WHY (KERNEL_CACHE_STACKS=all tests every stack, as CI does)" >&2
fi
# The all-stacks run also installs the README's CPU-host lines into a fresh venv (tests/test_install.py,
# on the current stack: two minutes and 1.5 GB of downloads); KC_TEST_FRESH_INSTALL=1 asks for it in any run.
if [ "${KERNEL_CACHE_STACKS:-}" = all ]; then export KC_TEST_FRESH_INSTALL="${KC_TEST_FRESH_INSTALL:-1}"; fi
if [ "${1:-}" = "--which-stacks" ]; then echo "$STACKS"; exit 0; fi  # what would be tested; nothing installed
# The remote-level tests need a real redis-server: installed from Debian's packages where missing and
# this runs as root (as .ci/run does); elsewhere they skip with the reason.
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null && ! command -v redis-server >/dev/null; then
  (timeout 240 apt-get update -qq && DEBIAN_FRONTEND=noninteractive timeout 240 \
     apt-get install -y -qq --no-install-recommends redis-server) >/dev/null 2>&1 \
    || echo "test.sh: redis-server not installed; the remote-level tests will skip" >&2
fi
status=0
summary=()
for stack in $STACKS; do
  echo "test.sh: === the $stack stack ===" >&2
  set +e  # the stack's status is collected below; inside, every step must pass (set -e again)
  (
    set -euo pipefail
    export KERNEL_CACHE_STACK="$stack"
    source "$ROOT/scripts/setup_env.sh"
    echo "test.sh: $("$VENV/bin/python" -c 'import sys, jax, jaxlib, triton; print("Python %d.%d.%d" % sys.version_info[:3], "jax", jax.__version__, "jaxlib", jaxlib.__version__, "triton", triton.__version__)')" >&2
    if [ "${KERNEL_CACHE_SKIP_LINT:-0}" != "1" ]; then
      echo "test.sh: ruff check" >&2
      python -m ruff check . --output-format concise
      echo "test.sh: mypy (strict: kernel_cache, cachectl, compiler, lowering, scripts; the $stack stack)" >&2
      # a cache per stack: one shared by venvs of other packages is invalidated at every switch
      python -m mypy --no-error-summary --cache-dir "$ROOT/.mypy_cache/$stack" \
        --python-version "$(python -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
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
  if [ "$rc" = 0 ]; then summary+=("$stack: passed"); else summary+=("$stack: FAILED (exit $rc)"); fi
  if [ "$rc" != 0 ] && [ "$status" = 0 ]; then status=$rc; fi
done
echo "test.sh: ${summary[*]}" >&2
exit "$status"
