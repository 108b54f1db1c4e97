"""The run's anakin chunk with its environment's single-index scatters as selects (a run's
default on a GPU or TPU) or as scatters (its default on the CPU).

  python -m bench.env_selects --flagfile=launch/configs/cartpole_anakin_purejaxrl.cfg \\
      --env=gymnax:Breakout-MinAtar --seed_counts=1,32 --total_steps=20000 --repeats=4

gymnax's MinAtar games and bsuite tasks write their observations and
pieces with `x.at[...].set(...)`, one scatter each, which XLA runs as a
kernel of its own; `acme_jax_dqn.envs.scatter_selects` computes the same
values with each single-index scatter as a select, which XLA fuses with
its neighbours. For each seed count, init and the run's chunk programs
are compiled both ways; each program's kernels per iteration (counted as
bench/packed_carry.py counts them) are printed beside the time of one
run, the two called in turn after a warm-up round; the table gives the
median of the rounds' ratios (env steps/s, selects over scatters) and
whether both trained the same parameters.
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
flags.DEFINE_list("seed_counts", ["1", "32"], "Seeds on the one device, one program each.")
flags.DEFINE_integer("repeats", 4, "Timed rounds per seed count after the warm-up round.")
flags.DEFINE_string("out", "", "Markdown table to write (default: "
                    "bench/results/env_selects_<backend>.md).")
FLAGS = flags.FLAGS


def main(argv):
  del argv
  config, experiment = harness.anakin_run_flags(FLAGS.repeats)
  anakin_programs.compare_pair(
      experiment, config, harness.seed_counts(FLAGS.seed_counts), FLAGS.repeats,
      {"scatters": anakin_programs.Variant(selects=False),
       "selects": anakin_programs.Variant(selects=True)},
      f"compiled with {experiment.env}'s single-index scatters as selects and as scatters",
      FLAGS.out or f"bench/results/env_selects_{jax.default_backend()}.md")


if __name__ == "__main__":
  app.run(main)
