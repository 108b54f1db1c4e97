#!/usr/bin/env bash
# The GPU benches in one call, the most telling first, each within what is left of a deadline.
#
#   bash bench/gpu_all.sh                              # on the GPU, from the repository root
#   OUT=/tmp/gpu TINY=1 WHEELS=0 bash bench/gpu_all.sh   # the script itself, tiny, on a CPU
#
# PUREJAXRL_DIR  a checkout of luchris429/purejaxrl at 31756b1 (default: .peer)
# OUT            where the tables, logs and runs go (default: runs/gpu_all)
# DEADLINE       seconds for the whole script (default: 560); a step that would start with
#                under 30 s left is skipped, and each step's cap is cut to what is left (less
#                10 s in which a step that was told to stop finishes its checkpoint)
# TINY=1         small sizes (8 seeds for 2,048, 2 Breakout-MinAtar seeds for 64; 20,000 env
#                steps, 5,000 for the fused-loss, target-update, packed-carry,
#                packed-items and env-selects benches, 4,000 traced), to check the script
# PYTHON         the interpreter (default: python3)
# .whl/          wheels installed first, where present (bench/gpu_wheels.sh fetches them), for a
#                GPU host that cannot reach a package index; WHEELS=0 leaves them (they are for
#                the GPU host's Python 3.12: a tiny run on another Python skips them)
#
# In order: ours beside PureJaxRL at the defaults (every goal); the fused loss against XLA's (one
# batch, then the run's programs), at 2,048 seeds and at one, in 128-row and 32-row passes;
# Breakout-MinAtar at one seed with cuDNN's convolutions, with two iterations per loop step and
# with patch products; its matmuls with XLA's tilings and without split-K; ours beside PureJaxRL
# with the fused loss; where the device's time goes (bench/kernel_times.py) on Breakout at one
# seed, then on CartPole at 2,048 seeds beside PureJaxRL's kernels (each op with its modelled
# bytes); Breakout's three runs again; the target update as a select in every learner step and in
# a loop that runs when it is due, at 2,048 seeds; the loops' carry packed and plain; the
# replay's items packed and a leaf per field, at one seed; Breakout-MinAtar's scatters as selects
# and as scatters, at one seed; CartPole's one-seed matmuls with XLA's tilings and without
# split-K; the device's time at 2,048 seeds with the fused loss; the build's compile schedules;
# ours at 2,048 seeds beside PureJaxRL as it is and with its seeds independent. On an H200 the
# list outlasts the default deadline (the gpu_speed step alone took 230 s on 2026-12-04), so the
# steps that decide a default come first.
# STEPS          step names to run, separated by spaces or commas (default: all), e.g.
#                STEPS=packed_carry,compile_time for a second call that finishes what the
#                first one's deadline cut
# BUNDLE         a .tar.gz file that the tables, step outputs, log and runs' summary.json files
#                under $OUT are packed into after every step and at the end (the checkpoints
#                stay out), for a GPU host that hands back only a few files or one folder, e.g.
#                `BUNDLE=/results/gpu_all.tar.gz OUT=/tmp/gpu_all bash bench/gpu_all.sh`; name a
#                file outside OUT (the shell expands `$OUT` in BUNDLE=$OUT/... with the OUT of
#                the assignments before it on the line)
# Every step's output is in $OUT/<step>.txt, its tail in $OUT/log.txt, its table in $OUT/*.md.
set -u
START=$(date +%s)
OUT=${OUT:-runs/gpu_all}
PEER=${PUREJAXRL_DIR:-.peer}
DEADLINE=${DEADLINE:-560}
CFG=launch/configs/cartpole_anakin_purejaxrl.cfg
PY=${PYTHON:-python3}
mkdir -p "$OUT"
if [ -n "${BUNDLE:-}" ]; then
  if ! mkdir -p "$(dirname "$BUNDLE")" || [ ! -w "$(dirname "$BUNDLE")" ]; then
    echo "BUNDLE=$BUNDLE: cannot write to $(dirname "$BUNDLE")" | tee -a "$OUT/log.txt"
    exit 2
  fi
  BUNDLE=$(cd "$(dirname "$BUNDLE")" && pwd)/$(basename "$BUNDLE")  # Steps run elsewhere.
fi

bundle() {  # Packs what a reader needs (not the runs' checkpoints), whole or not at all.
  [ -n "${BUNDLE:-}" ] || return 0
  (cd "$OUT" && find . -maxdepth 4 -type f \( -name '*.md' -o -name '*.txt' \
    -o -name summary.json \) -print0 | tar -czf "$BUNDLE.part" --null -T -) \
    && mv -f "$BUNDLE.part" "$BUNDLE"
}
if [ "${WHEELS:-1}" != 0 ] && ls .whl/*.whl > /dev/null 2>&1; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/gpu_all_site .whl/*.whl \
    || { echo "installing .whl/ failed" | tee -a "$OUT/log.txt"; bundle; exit 1; }
  export PYTHONPATH=/tmp/gpu_all_site${PYTHONPATH:+:$PYTHONPATH}
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
if [ "${TINY:-0}" = 1 ]; then
  STEPS_PER_SEED=20000; MANY=8; MINATAR_MANY=2; FUSED_STEPS=5000; TRACED_STEPS=4000
  PACKED_STEPS=5000
else
  STEPS_PER_SEED=200000; MANY=2048; MINATAR_MANY=64; FUSED_STEPS=100000; TRACED_STEPS=20000
  PACKED_STEPS=50000
fi
if [ ! -f "$PEER/purejaxrl/dqn.py" ]; then
  echo "no PureJaxRL checkout at $PEER (PUREJAXRL_DIR): the steps beside it are skipped" \
    | tee -a "$OUT/log.txt"
fi

step() {  # step NAME CAP_S COMMAND...
  local name=$1 cap=$2 left
  shift 2
  if [ -n "${STEPS:-}" ] && [[ ",${STEPS// /,}," != *",$name,"* ]]; then
    return
  fi
  left=$(( DEADLINE - ($(date +%s) - START) ))
  if [ "$left" -lt 30 ]; then
    echo "== $name: skipped, ${left} s left" | tee -a "$OUT/log.txt"
    bundle
    return
  fi
  [ "$cap" -gt $(( left - 10 )) ] && cap=$(( left - 10 ))
  echo "== $name: at $(( $(date +%s) - START )) s, cap $cap s" | tee -a "$OUT/log.txt"
  # Its own process group (setsid): what the step started (a bench's runs) goes with it.
  setsid timeout -k 10 "$cap" "$@" > "$OUT/$name.txt" 2>&1 &
  local pid=$! code
  wait "$pid"
  code=$?
  kill -KILL -- -"$pid" 2> /dev/null
  echo "exit code $code" >> "$OUT/$name.txt"
  tail -n 25 "$OUT/$name.txt" >> "$OUT/log.txt"
  bundle
}

peer() { [ -f "$PEER/purejaxrl/dqn.py" ]; }

breakout() {  # breakout NAME SUFFIX RUN_FLAGS (comma separated)
  step "gpu_speed_breakout_$1$2" 60 $PY -m bench.gpu_speed --purejaxrl_dir="$PEER" --num_seeds= \
    --minatar_seeds=1 --total_steps=$STEPS_PER_SEED --extra_flags="$3" \
    --logdir="$OUT/runs_breakout_$1$2" --out="$OUT/gpu_speed_breakout_$1$2.md"
}

peer && step gpu_speed 240 $PY -m bench.gpu_speed --purejaxrl_dir="$PEER" \
  --num_seeds=1,$MANY --minatar_seeds=1,$MINATAR_MANY --total_steps=$STEPS_PER_SEED \
  --logdir="$OUT/runs_default" --out="$OUT/gpu_speed.md"
# 2,048 seeds first (the goal rests on it; each row prints as it is measured), and a second
# kernel that passes the batch in blocks of 32 rows, whose gradients add up in registers: built
# for an H200 by Triton 3.6 with 8 warps, a thread of one 128-row pass spills 64 bytes, of 32-row
# passes 636 (bench/fused_kernel_resources.py, bench/results/fused_kernel_resources_h200.md).
step fused_loss 150 $PY -m bench.fused_loss --flagfile=$CFG --seed_counts=$MANY,1 \
  --total_steps=$FUSED_STEPS --num_warps=8 --row_blocks=128,32 --repeats=2 \
  --out="$OUT/fused_loss.md"
PEER_FLAG=""
peer && PEER_FLAG="--purejaxrl_dir=$PEER"
# Breakout-MinAtar at one seed with cuDNN's convolutions, with two iterations per loop step
# (cuDNN's) and with patch products: unrolled, 61.5 kernels per learning iteration against 67
# for an H200 (bench/results/hlo_kernels_h200_breakout_scan_unroll_2.md), for a longer compile.
# A round here, a second one later, alternating.
breakout_round() {  # breakout_round SUFFIX
  breakout lax_conv "$1" --conv_impl=lax_conv
  breakout unroll_2 "$1" --conv_impl=lax_conv,--scan_unroll=2
  breakout patches "$1" --conv_impl=patches
}
breakout_round ""
# One seed's matmuls without split-K. Compiled for an H200 without a device, XLA's default tilings
# split the learner's small matmuls over their inner dimension (a pad before and a sum after each):
# 50 kernels per learning iteration on CartPole, 43 with xla_gpu_experimental_force_split_k=1;
# 67 and 60 on Breakout-MinAtar (bench/hlo_kernels.py --xla_options). A GPU's autotuner picks its
# own tilings, so only a device can say whether one split runs faster.
step split_k_breakout 60 $PY -m bench.compiler_options --flagfile=$CFG \
  --env=gymnax:Breakout-MinAtar --seed_counts=1 --total_steps=$PACKED_STEPS \
  --variants=xla_gpu_experimental_force_split_k=1 --repeats=3 --out="$OUT/split_k_breakout.md"
peer && step gpu_speed_fused_loss 150 $PY -m bench.gpu_speed --purejaxrl_dir="$PEER" \
  --num_seeds=1,$MANY --minatar_seeds= --total_steps=$STEPS_PER_SEED --extra_flags=--fused_loss \
  --logdir="$OUT/runs_fused_loss" --out="$OUT/gpu_speed_fused_loss.md"
step kernel_times_breakout 60 $PY -m bench.kernel_times --flagfile=$CFG \
  --env=gymnax:Breakout-MinAtar --total_steps=$TRACED_STEPS --out="$OUT/kernel_times_breakout.md"
step kernel_times_many_xla 90 $PY -m bench.kernel_times --flagfile=$CFG --num_seeds=$MANY \
  --total_steps=$TRACED_STEPS --top=40 $PEER_FLAG --out="$OUT/kernel_times_many_xla.md"
breakout_round _2
step target_update 100 $PY -m bench.target_update --flagfile=$CFG --seed_counts=$MANY \
  --total_steps=$PACKED_STEPS --repeats=2 --out="$OUT/target_update.md"
step packed_carry 90 $PY -m bench.packed_carry --flagfile=$CFG --seed_counts=1,$MANY \
  --total_steps=$PACKED_STEPS --repeats=2 --out="$OUT/packed_carry.md"
step packed_items 60 $PY -m bench.packed_carry --what=items --flagfile=$CFG --seed_counts=1 \
  --total_steps=$PACKED_STEPS --repeats=2 --out="$OUT/packed_items.md"
step env_selects 75 $PY -m bench.env_selects --flagfile=$CFG --env=gymnax:Breakout-MinAtar \
  --seed_counts=1 --total_steps=$PACKED_STEPS --repeats=2 --out="$OUT/env_selects.md"
# CartPole's one-seed matmuls without split-K (the counts: above split_k_breakout).
step split_k 60 $PY -m bench.compiler_options --flagfile=$CFG --seed_counts=1 \
  --total_steps=$PACKED_STEPS --variants=xla_gpu_experimental_force_split_k=1 --repeats=3 \
  --out="$OUT/split_k.md"
step kernel_times_many_fused 60 $PY -m bench.kernel_times --flagfile=$CFG --num_seeds=$MANY \
  --total_steps=$TRACED_STEPS --fused_loss --out="$OUT/kernel_times_many_fused.md"
peer && step compile_time 90 $PY -m bench.compile_time --flagfile=$CFG --num_seeds=$MANY \
  --total_steps=$STEPS_PER_SEED --repeats=1 --purejaxrl_dir="$PEER" --out="$OUT/compile_time.md"
peer && step gpu_speed_independent_seeds 180 $PY -m bench.gpu_speed --purejaxrl_dir="$PEER" \
  --num_seeds=$MANY --minatar_seeds= --total_steps=$STEPS_PER_SEED --purejaxrl_independent_seeds \
  --logdir="$OUT/runs_independent_seeds" --out="$OUT/gpu_speed_independent_seeds.md"
echo "== done at $(( $(date +%s) - START )) s" | tee -a "$OUT/log.txt"
bundle
