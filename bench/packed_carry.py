"""The run's anakin chunk with its loops' carry packed in one word vector (the default) or plain;
or with its replay items stored packed (the default) or a leaf per field.

  python -m bench.packed_carry --flagfile=launch/configs/cartpole_anakin_purejaxrl.cfg \\
      --seed_counts=1,32 --total_steps=20000 --repeats=6 [--what=items]

For each seed count, init and the run's chunk programs (one seed
unbatched, more vmapped, as launch.run_dqn lays out a device's block) are
compiled twice. `--what=carry`: with the environments, observations,
counters and keys carried in one uint32 vector
(`acme_jax_dqn.anakin_loops.carry_scan`) and with every leaf carried on
its own. XLA updates a loop's carried buffers
in place and copies a leaf whose old value is still read after its new
value is written (the environment's state, read again by the kernels that
store the transition): on a GPU one copy kernel per such leaf per
iteration, which the packed carry turns into one. `--what=items`: with the
replay storing each transition as its observation and one word vector per
word width (`acme_jax_dqn.replay.PackedItems`) and as a leaf per field: on
a GPU one write kernel per stored array per iteration. Each program's kernels
per iteration, counted in its optimized HLO as bench/hlo_kernels.py
counts them (the loop with the most iterations of the last chunk
program: the learning loop unless the warm-up is longer, or the loop
with the conditional), the copies at the top level of its body and its
modelled MB (bench/hlo_count.py) are printed beside the time of one run: init and
every chunk of the plan with its metrics copied to the host. The two are
called in turn, a warm-up round first; the table gives the median of the
rounds' ratios (env steps/s, packed over plain) and whether both trained
the same parameters.
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
flags.DEFINE_integer("repeats", 6, "Timed rounds per seed count after the warm-up round.")
flags.DEFINE_enum("what", "carry", ["carry", "items"], "What is packed or plain: the loops' "
                  "carry or the replay's items.")
flags.DEFINE_string("out", "", "Markdown table to write (default: "
                    "bench/results/packed_<what>_<backend>.md).")
FLAGS = flags.FLAGS
VARIANTS = {"carry": {"plain": anakin_programs.Variant(packed=False),
                      "packed": anakin_programs.Variant(packed=True)},
            "items": {"plain": anakin_programs.Variant(items=False),
                      "packed": anakin_programs.Variant(items=True)}}
CAPTIONS = {"carry": "compiled with the loops' carry packed in one word vector and plain",
            "items": "compiled with the replay's items stored packed (an observation array "
                     "and one word vector per word width) and a leaf per field"}


def main(argv):
  del argv
  config, experiment = harness.anakin_run_flags(FLAGS.repeats)
  anakin_programs.compare_pair(
      experiment, config, harness.seed_counts(FLAGS.seed_counts), FLAGS.repeats,
      VARIANTS[FLAGS.what], CAPTIONS[FLAGS.what],
      FLAGS.out or f"bench/results/packed_{FLAGS.what}_{jax.default_backend()}.md")


if __name__ == "__main__":
  app.run(main)
