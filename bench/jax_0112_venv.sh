#!/usr/bin/env bash
# A Python 3.12 virtualenv with JAX 0.11.2, the version of the H200 runs in docs/benchmarks.md
# (JAX left Python 3.11 behind at 0.11, so the project's 3.11 environment stays at 0.10.2):
# the benches run in it on the CPU with that version, the kit's wheels installed as
# bench/gpu_all.sh installs them on a GPU host, and bench/hlo_kernels.py --target=h200 compiles
# with that version's XLA for the GPU.
#
#   bash bench/jax_0112_venv.sh    # from the repository root: makes $VENV (default /tmp/jax_0112)
#   PYTHON=/tmp/jax_0112/bin/python OUT=/tmp/gpu TINY=1 bash bench/gpu_all.sh
#   PYTHONPATH=$PWD:/tmp/jax_0112/site:/tmp/jax_0112/cuda /tmp/jax_0112/bin/python \
#     -m bench.hlo_kernels --flagfile=launch/configs/cartpole_anakin_purejaxrl.cfg --target=h200
#
# PYTHON312  a Python 3.12 interpreter (default: python3.12)
# VENV       the virtualenv to make (default: /tmp/jax_0112); the kit's wheels go to $VENV/site
#            (from .whl/, which bench/gpu_wheels.sh fetches when it is missing) and JAX's CUDA
#            plugin, for --target=h200 alone, to $VENV/cuda
# Besides JAX, the virtualenv holds the packages the kit takes from a GPU image that has JAX,
# flax, optax, chex, orbax, matplotlib and seaborn, and Triton 3.6.0, with which
# bench/fused_kernel_resources.py builds the fused loss kernel.
set -eu
PY312=${PYTHON312:-python3.12}
VENV=${VENV:-/tmp/jax_0112}
JAX=0.11.2
"$PY312" -m venv "$VENV"
"$VENV/bin/pip" install -q "jax==$JAX" "jaxlib==$JAX" absl-py chex flax optax orbax-checkpoint \
  matplotlib seaborn tqdm flatbuffers tabulate six scipy pyyaml triton==3.6.0
ls .whl/*.whl > /dev/null 2>&1 || bash bench/gpu_wheels.sh
"$VENV/bin/pip" install -q --no-deps --upgrade --target "$VENV/site" .whl/*.whl
"$VENV/bin/pip" install -q --no-deps --upgrade --target "$VENV/cuda" "jax-cuda13-plugin==$JAX" \
  "jax-cuda13-pjrt==$JAX"
"$VENV/bin/python" -c "import jax; print('jax', jax.__version__, 'in $VENV')"
