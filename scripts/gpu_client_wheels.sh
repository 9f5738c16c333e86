#!/usr/bin/env bash
# Downloads into .whl/ the wheels a GPU host (Python 3.12, jax 0.11.2, triton 3.6.0, no internet) needs
# to import the client libraries that KERNEL_CACHE_INTERCEPT serves: jax-triton 0.3.1, ejKernel 0.0.80.3
# and ejKernel's runtime dependencies, at the versions CI tests (pydantic-core at the exact version
# pydantic pins). --no-deps: ejKernel pins jax~=0.10, so the host keeps its own jax/jaxlib/triton.
# On the host:
#   python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD
# kernel-cache itself must be pip-installed there, not only on PYTHONPATH (its KERNEL_CACHE_INTERCEPT .pth
# hook and its kernel_cache.clients entry points): this also builds its wheel, from the committed tree,
# into .whl/kernel-cache/ (not matched by .whl/*.whl, and not for --target, where a .pth is never run):
#   python3 -m pip install -q --no-index --no-deps .whl/kernel-cache/kernel_cache-*.whl
# ($PWD first on PYTHONPATH keeps the working tree's modules in charge; the wheel gives hook + entry points.)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] && PY=${PYTHON:-.venv/bin/python}
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --platform manylinux2014_x86_64 \
    -d .whl \
    jax-triton==0.3.1 ejkernel==0.0.80.3 \
    beartype==0.23.1 chex==0.1.92 einops==0.8.2 jaxtyping==0.3.11 \
    pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5 \
    typing-extensions==4.16.0 tqdm==4.70.1 toolz==1.2.0 wadler-lindig==0.1.8 absl-py==2.5.1 \
    transformer-engine==2.20.2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
git archive HEAD | tar -x -C "$tmp"
rm -rf .whl/kernel-cache
"$PY" -m pip wheel -q --no-deps -w .whl/kernel-cache "$tmp" 2>&1 | grep -v "is ignored: it is neither" >&2 || true
ls -1 .whl .whl/kernel-cache
