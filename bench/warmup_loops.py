"""The anakin training chunk three ways: warm-up decided by a conditional, or run as loops of its
own, with or without the acting forward kept apart from the learner's.

  python -m bench.warmup_loops --flagfile=launch/configs/cartpole_anakin_purejaxrl.cfg \\
      --seed_counts=1,32 --total_steps=20000 --repeats=6

For each seed count, the chunk program of the command's run flags is
compiled three times on one device (one seed unbatched, more vmapped, as
launch.run_dqn lays out a device's block of seeds): once with a
conditional on the iteration index that decides each iteration whether it
learns (`train_chunk(..., warmup=None)`), once with the warm-up iterations
as one loop and the learning iterations as another (`warmup=` the chunk's
count), and the loops again with `acting_apart` (an optimization barrier
between the acting forward and the learner's, which a GPU compiler would
otherwise merge into one matmul). One run is init and every chunk of the
plan with its metrics copied to the host (no evaluation). The three are
called in turn, a warm-up round first; each round gives ratios (env
steps/s: loops over conditional, loops apart over loops) and the table
prints their medians, whether all trained the same parameters and
metrics, and how many calls of each XLA split between its CPU worker
threads. `seed_layout.warmup_loops` picks between the first two on the CPU
from these measurements; on a GPU it and `seed_layout.acting_apart` pick
from the kernel counts and modelled bytes of bench/hlo_kernels.py and the
H200 runs of this bench (bench/results/warmup_loops_h200*.md).
"""

import os
import statistics
import sys

from absl import app
from absl import flags
import jax
import numpy as np

from acme_jax_dqn import checkpointing
from acme_jax_dqn import xla_setup
from launch import flags as launch_flags

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # For `bench`.
from bench import anakin_programs  # pylint: disable=wrong-import-position
from bench import harness  # pylint: disable=wrong-import-position

launch_flags.define_flags()
flags.DEFINE_list("seed_counts", ["1", "32"], "Seeds on the one device, one program each.")
flags.DEFINE_integer("repeats", 6, "Timed pairs per seed count after the warm-up pair.")
flags.DEFINE_string("out", "", "Markdown table to write (default: "
                    "bench/results/warmup_loops_<backend>.md).")
FLAGS = flags.FLAGS


def same_rows(a, b) -> bool:
  """Rows equal up to float rounding (the loops sum a chunk's metrics in another order)."""
  return all(np.allclose(np.asarray(x[k], np.float64), np.asarray(y[k], np.float64),
                         rtol=1e-5, atol=0.0, equal_nan=True) for x, y in zip(a, b) for k in x)


def main(argv):
  del argv
  config, experiment = harness.anakin_run_flags(FLAGS.repeats)
  if config.pqn:
    harness.bad_input("--pqn: PQN learns every iteration and has no warm-up; pass a "
                      "replay-based preset.")
  counts = harness.seed_counts(FLAGS.seed_counts)
  table = harness.PrintedTable(
      ["seeds", "warm-up / chunk iterations", "compile s (conditional, loops, loops apart)",
       "conditional s", "loops s", "loops apart s", "loops / conditional (env steps/s)",
       "loops apart / loops", "same params (rows within 1e-5)",
       "calls split between XLA's worker threads (conditional, loops, loops apart)"],
      summary=harness.jax_here())
  medians, apart_medians = [], []
  for num_seeds in counts:
    with xla_setup.prng_impl(experiment.prng_impl):
      progs, plan, warmup = anakin_programs.programs(experiment, config, num_seeds)
      cpu = {}
      times, results = anakin_programs.timed_rounds(progs, FLAGS.repeats, cpu)
    ratios = [c / l for c, l in zip(times["conditional"], times["loops"])]
    apart = [l / a for l, a in zip(times["loops"], times["loops apart"])]
    medians.append(statistics.median(ratios))
    apart_medians.append(statistics.median(apart))
    (p_cond, rows_cond) = results["conditional"]
    same = all(checkpointing.params_checksum(p_cond) == checkpointing.params_checksum(p)
               and same_rows(rows_cond, rows) for p, rows in results.values())
    table.add(
        f"| {num_seeds} | {warmup:,} / {plan.iterations_per_chunk:,} | "
        + ", ".join(f"{prog.compile_s:.1f}" for prog in progs.values()) + " | "
        + " | ".join(f"{statistics.median(t):.2f}" for t in times.values())
        + f" | {medians[-1]:.2f}x ({min(ratios):.2f}-{max(ratios):.2f}) | "
        f"{apart_medians[-1]:.2f}x ({min(apart):.2f}-{max(apart):.2f}) | "
        f"{'yes' if same else 'NO'} | "
        + ", ".join(anakin_programs.split_calls(cpu[name]) for name in progs) + " |")
  table.close(
      FLAGS.out or f"bench/results/warmup_loops_{jax.default_backend()}.md",
      f"compared: the training chunks of the command's run flags, {plan.num_chunks} chunk(s) of "
      f"{plan.iterations_per_chunk:,} iterations ({plan.env_steps:,} env steps per seed), "
      "compiled with a per-iteration conditional, with the warm-up as a loop of its own, and "
      "with those loops acting apart from the learner's forward, then called in turn, "
      f"{FLAGS.repeats} timed rounds per seed count after a warm-up round; the medians of the "
      "rounds' ratios, loops / conditional: "
      + ", ".join(f"{n} seed(s) {m:.2f}x" for n, m in zip(counts, medians))
      + "; loops apart / loops: "
      + ", ".join(f"{n} seed(s) {m:.2f}x" for n, m in zip(counts, apart_medians)) + ". "
      "Calls split: those whose other threads took at least a quarter of the call's CPU "
      "time, XLA's CPU runtime having handed part of each loop step to its second worker "
      "thread (read from /proc; n/a elsewhere).")


if __name__ == "__main__":
  app.run(main)
