"""The run's anakin chunk with the target network moved by a select every learner step or in a
loop that runs only when an update is due.

  python -m bench.target_update --flagfile=launch/configs/cartpole_anakin_purejaxrl.cfg \\
      --seed_counts=32 --total_steps=20000 --repeats=4

For each seed count, init and the run's chunk programs (one seed
unbatched, more vmapped, as launch.run_dqn lays out a device's block) are
compiled twice: with `update_target`'s element-wise select, which reads
the online and target parameters and writes the target in every learner
step, and with the update in a loop of 0 or 1 trips
(`acme_jax_dqn.target_updates.target_update_in_loop`), which reads and writes
them only in the steps where an update is due and costs every step a test
of the loop's predicate (on a GPU, read by the host). Each
program's kernels per iteration and modelled MB of a learning iteration
with no update due (bench/hlo_count.py, the loop with the most iterations
of its last chunk program) are printed beside the time of one run: init
and every chunk of the plan with its metrics copied to the host. The two
are called in turn, a warm-up round first; the table gives the median of
the rounds' ratios (env steps/s, loop over select) and whether both
trained the same parameters. A run picks the loop where the select would
move at least `agents.dqn.seed_layout.TARGET_LOOP_MIN_BYTES` per learner
step on an accelerator (`seed_layout.target_update_loop`).
"""

import os
import sys

from absl import app
from absl import flags
import jax

from launch import flags as launch_flags

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # For `bench`.
from bench import anakin_programs  # pylint: disable=wrong-import-position
from bench import harness  # pylint: disable=wrong-import-position

launch_flags.define_flags()
flags.DEFINE_list("seed_counts", ["32"], "Seeds on the one device, one program each.")
flags.DEFINE_integer("repeats", 4, "Timed rounds per seed count after the warm-up round.")
flags.DEFINE_string("out", "", "Markdown table to write (default: "
                    "bench/results/target_update_<backend>.md).")
FLAGS = flags.FLAGS
VARIANTS = {"select": anakin_programs.Variant(target_loop=False),
            "loop": anakin_programs.Variant(target_loop=True)}


def main(argv):
  del argv
  config, experiment = harness.anakin_run_flags(FLAGS.repeats)
  anakin_programs.compare_pair(
      experiment, config, harness.seed_counts(FLAGS.seed_counts), FLAGS.repeats, VARIANTS,
      f"compiled with the target update (every {config.target_update_period} learner steps) "
      "as a select in every step and as a loop that runs when it is due",
      FLAGS.out or f"bench/results/target_update_{jax.default_backend()}.md")


if __name__ == "__main__":
  app.run(main)
