#!/usr/bin/env bash
# Shared set-up for test.sh and demo.sh: a .venv with kernel-cache, its test and clients extras
# (jax-triton, ejKernel: the libraries KERNEL_CACHE_INTERCEPT serves), and
# jax-cuda13-plugin at exactly jaxlib's version (installed --no-deps: 7.5 MB, enough to
# cross-lower for cuda on a CPU-only host). Where `nvidia-smi -L` lists a GPU, also jax's CUDA
# runtime (`jax[cuda13]` at jax's version, several GB of NVIDIA wheels) so the GPU tests run;
# KERNEL_CACHE_NO_GPU_DEPS=1 skips that. Re-runs skip the install while inputs are unchanged.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${KERNEL_CACHE_VENV:-$ROOT/.venv}"
PY="${PYTHON:-python3}"
if [ ! -x "$VENV/bin/python" ]; then
  echo "setup: creating $VENV" >&2
  "$PY" -m venv "$VENV"
fi
STAMP="$VENV/.kernel-cache-installed"
GPU=0
if [ "${KERNEL_CACHE_NO_GPU_DEPS:-0}" != "1" ] && command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  GPU=1
fi
WANT="$( (cat "$ROOT/pyproject.toml" "$ROOT/setup.py" "$ROOT/kernel_cache_intercept.pth" "$ROOT/scripts/constraints.txt" "$ROOT/scripts/setup_env.sh"; echo "gpu=$GPU") | sha256sum | cut -c1-16)"
if [ ! -f "$STAMP" ] || [ "$(cat "$STAMP")" != "$WANT" ]; then
  echo "setup: installing kernel-cache and test dependencies into $VENV" >&2
  "$VENV/bin/python" -m pip install -q --upgrade pip >/dev/null 2>&1 || true
  "$VENV/bin/python" -m pip install -q -c "$ROOT/scripts/constraints.txt" -e "$ROOT[test,clients]"
  JAXLIB_VERSION="$("$VENV/bin/python" -c 'import jaxlib.version as v; print(v.__version__)')"
  "$VENV/bin/python" -m pip install -q --no-deps "jax-cuda13-plugin==$JAXLIB_VERSION"
  # TransformerEngine's pure-Python wheel, for its triton_extensions sources (the interception tests);
  # --no-deps: its CUDA extension and framework packages are neither needed nor installable here
  "$VENV/bin/python" -m pip install -q --no-deps "transformer-engine==2.20.2"
  if [ "$GPU" = "1" ]; then
    JAX_VERSION="$("$VENV/bin/python" -c 'import jax; print(jax.__version__)')"
    echo "setup: a GPU is visible: installing jax[cuda13]==$JAX_VERSION so the GPU tests run" >&2
    "$VENV/bin/python" -m pip install -q -c "$ROOT/scripts/constraints.txt" "jax[cuda13]==$JAX_VERSION"
  fi
  echo "$WANT" > "$STAMP"
fi
export PATH="$VENV/bin:$PATH"
