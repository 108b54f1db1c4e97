#!/usr/bin/env bash
# Fetches into .whl/ the Python 3.12 wheels that bench/gpu_all.sh installs first: the kit's
# requirements that a GPU image with JAX, flax, optax, chex, orbax, matplotlib and seaborn
# lacks, at the versions the kit is tested with. For a GPU host that cannot reach a package
# index; run it where one can be reached, then bring .whl/ along.
#
#   bash bench/gpu_wheels.sh && du -sh .whl
set -eu
WANTS="dm-haiku==0.0.17 jmp==0.0.4 rlax==0.1.9 distrax==0.1.9 tfp-nightly==0.26.0.dev20261027
decorator==5.2.1 gast==0.7.0 dm-tree==0.1.10 dm-env==1.6 flashbax==0.1.3 gymnax==1.0.1
gymnasium==1.2.2 farama-notifications==0.0.6 tensorboardX==2.6.5"
PLATFORMS=""
for n in 39 35 34 31 28 27 24 17; do PLATFORMS="$PLATFORMS --platform manylinux_2_${n}_x86_64"; done
mkdir -p .whl
# shellcheck disable=SC2086
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
  --implementation cp $PLATFORMS --platform manylinux2014_x86_64 --platform any -d .whl $WANTS
ls .whl
