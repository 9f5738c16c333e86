#!/usr/bin/env bash
# Shared set-up for test.sh and demo.sh: a virtual environment for one stack (scripts/stacks/):
# KERNEL_CACHE_STACK=oldest (default; Python 3.11, jax 0.10.2, jax-triton 0.3.1, ejKernel) in .venv,
# or current (Python 3.12, jax 0.12.0.1, jax-triton 0.4.1) in .venv-current. Each holds kernel-cache
# (editable) with its test extra, the stack's pins, TransformerEngine's pure-Python wheel (--no-deps:
# its sources for the interception tests) and jax-cuda13-plugin at exactly jaxlib's version
# (--no-deps: 7.5 MB, enough to cross-lower for cuda on a CPU-only host). Where `nvidia-smi -L` lists a
# GPU, also jax's CUDA runtime (`jax[cuda13]` at jax's version, several GB); KERNEL_CACHE_NO_GPU_DEPS=1
# skips that. KERNEL_CACHE_VENV picks another directory. Re-runs skip the install while inputs are
# unchanged. Leaves VENV and STACK set and the venv's bin first on PATH.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
STACK="${KERNEL_CACHE_STACK:-oldest}"
PINS="$ROOT/scripts/stacks/$STACK.txt"
if [ ! -f "$PINS" ]; then
  echo "setup: KERNEL_CACHE_STACK=$STACK: no such stack (scripts/stacks/ has: $(cd "$ROOT/scripts/stacks" && ls *.txt | sed 's/\.txt$//' | tr '\n' ' '))" >&2
  exit 2
fi
if [ "$STACK" = oldest ]; then VENV="${KERNEL_CACHE_VENV:-$ROOT/.venv}"; else VENV="${KERNEL_CACHE_VENV:-$ROOT/.venv-$STACK}"; fi
source "$ROOT/scripts/stacks/python.sh"
if [ ! -x "$VENV/bin/python" ]; then
  PY="$(stack_python "$STACK")"
  if [ -z "$PY" ]; then
    echo "setup: the $STACK stack needs Python $(stack_python_version "$STACK"): none found on PATH or among pyenv's versions; set PYTHON=/path/to/python$(stack_python_version "$STACK")" >&2
    exit 2
  fi
  echo "setup: creating $VENV ($STACK stack, $("$PY" --version 2>&1))" >&2
  "$PY" -m venv "$VENV"
fi
STAMP="$VENV/.kernel-cache-installed"
GPU=0
if [ "${KERNEL_CACHE_NO_GPU_DEPS:-0}" != "1" ] && command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  GPU=1
fi
WANT="$( (cat "$ROOT/pyproject.toml" "$ROOT/setup.py" "$ROOT/kernel_cache_intercept.pth" "$PINS" "$ROOT/scripts/setup_env.sh"; echo "gpu=$GPU stack=$STACK") | sha256sum | cut -c1-16)"
if [ ! -f "$STAMP" ] || [ "$(cat "$STAMP")" != "$WANT" ]; then
  echo "setup: installing kernel-cache and the $STACK stack into $VENV" >&2
  "$VENV/bin/python" -m pip install -q --upgrade pip >/dev/null 2>&1 || true
  # setuptools' editable-install banner is noise for a newcomer: it goes to the log only
  "$VENV/bin/python" -m pip install -q -c "$PINS" -r "$PINS" -e "$ROOT[test]" 2>"$VENV/.install-log" \
    || { cat "$VENV/.install-log" >&2; exit 1; }
  JAXLIB_VERSION="$("$VENV/bin/python" -c 'import jaxlib.version as v; print(v.__version__)')"
  "$VENV/bin/python" -m pip install -q --no-deps "jax-cuda13-plugin==$JAXLIB_VERSION"
  # TransformerEngine's pure-Python wheel, for its triton_extensions sources (the interception tests);
  # --no-deps: its CUDA extension and framework packages are neither needed nor installable here
  "$VENV/bin/python" -m pip install -q --no-deps "transformer-engine==2.20.2"
  if [ "$GPU" = "1" ]; then
    JAX_VERSION="$("$VENV/bin/python" -c 'import jax; print(jax.__version__)')"
    echo "setup: a GPU is visible: installing jax[cuda13]==$JAX_VERSION so the GPU tests run" >&2
    "$VENV/bin/python" -m pip install -q -c "$PINS" "jax[cuda13]==$JAX_VERSION"
  fi
  echo "$STACK" > "$VENV/.kernel-cache-stack"
  echo "$WANT" > "$STAMP"
fi
export PATH="$VENV/bin:$PATH"
