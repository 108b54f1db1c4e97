"""The run's anakin chunk with its loops' carry packed in one word vector (the default) or plain.

  python -m bench.packed_carry --flagfile=launch/configs/cartpole_anakin_purejaxrl.cfg \\
      --seed_counts=1,32 --total_steps=20000 --repeats=6

For each seed count, init and the run's chunk programs (one seed
unbatched, more vmapped, as launch.run_dqn lays out a device's block) are
compiled twice: with the environments, observations, counters and keys
carried in one uint32 vector (`acme_jax_dqn.anakin_loops.carry_scan`) and
with every leaf carried on its own. XLA updates a loop's carried buffers
in place and copies a leaf whose old value is still read after its new
value is written (the environment's state, read again by the kernels that
store the transition): on a GPU one copy kernel per such leaf per
iteration, which the packed carry turns into one. Each program's kernels
per iteration, counted in its optimized HLO as bench/hlo_kernels.py
counts them (the loop with the most iterations of the last chunk
program: the learning loop unless the warm-up is longer, or the loop
with the conditional), and the copies at the top level of its body, are
printed beside the time of one run: init and
every chunk of the plan with its metrics copied to the host. The two are
called in turn, a warm-up round first; the table gives the median of the
rounds' ratios (env steps/s, packed over plain) and whether both trained
the same parameters.
"""

import os
import statistics
import sys

from absl import app
from absl import flags
import jax

from acme_jax_dqn import checkpointing
from acme_jax_dqn import xla_setup
from launch import flags as launch_flags

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # For `bench`.
from bench import anakin_programs  # pylint: disable=wrong-import-position
from bench import harness  # pylint: disable=wrong-import-position
from bench import hlo_count  # pylint: disable=wrong-import-position

launch_flags.define_flags()
flags.DEFINE_list("seed_counts", ["1", "32"], "Seeds on the one device, one program each.")
flags.DEFINE_integer("repeats", 6, "Timed rounds per seed count after the warm-up round.")
flags.DEFINE_string("out", "", "Markdown table to write (default: "
                    "bench/results/packed_carry_<backend>.md).")
FLAGS = flags.FLAGS
VARIANTS = {"plain": anakin_programs.Variant(packed=False),
            "packed": anakin_programs.Variant(packed=True)}


def kernels(program: anakin_programs.Program) -> str:
  """'<kernels> (<copies> copies)' per iteration of the loop with the most iterations in the
  last chunk program (the learning loop, unless a chunk's warm-up is longer; or the loop with
  the conditional); the copies are those at the loop body's top level."""
  counts = hlo_count.iteration_body(program.texts[-1])
  return f"{counts['per_iteration']} ({counts['copy']} copies)"


def main(argv):
  del argv
  config, experiment = harness.anakin_run_flags(FLAGS.repeats)
  counts = harness.seed_counts(FLAGS.seed_counts)
  table = harness.PrintedTable(
      ["seeds", "kernels per iteration (top-level copies), plain", "packed",
       "compile s (plain, packed)",
       "plain s", "packed s", "packed / plain (env steps/s)", "same params"],
      summary=harness.jax_here())
  medians = []
  for num_seeds in counts:
    with xla_setup.prng_impl(experiment.prng_impl):
      progs, plan, _ = anakin_programs.programs(experiment, config, num_seeds, VARIANTS)
      times, results = anakin_programs.timed_rounds(progs, FLAGS.repeats)
    ratios = [p / q for p, q in zip(times["plain"], times["packed"])]
    medians.append(statistics.median(ratios))
    same = len({checkpointing.params_checksum(r[0]) for r in results.values()}) == 1
    table.add(
        f"| {num_seeds} | {kernels(progs['plain'])} | {kernels(progs['packed'])} | "
        f"{progs['plain'].compile_s:.1f}, {progs['packed'].compile_s:.1f} | "
        f"{statistics.median(times['plain']):.2f} | {statistics.median(times['packed']):.2f} | "
        f"{medians[-1]:.2f}x ({min(ratios):.2f}-{max(ratios):.2f}) | "
        f"{'yes' if same else 'NO'} |")
  table.close(
      FLAGS.out or f"bench/results/packed_carry_{jax.default_backend()}.md",
      f"compared: the run's chunk programs for the command's run flags, {plan.num_chunks} "
      f"chunk(s) of {plan.iterations_per_chunk:,} iterations ({plan.env_steps:,} env steps per "
      "seed), compiled with the loops' carry packed in one word vector and plain, then called "
      f"in turn, {FLAGS.repeats} timed rounds per seed count after a warm-up round; the "
      "medians of the rounds' ratios, packed / plain: "
      + ", ".join(f"{n} seed(s) {m:.2f}x" for n, m in zip(counts, medians)) + ".")


if __name__ == "__main__":
  app.run(main)
