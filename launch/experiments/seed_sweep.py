"""One preset over N seeds (in sequence, or vmapped in anakin mode); writes a table and a plot.

  python -m launch.experiments.seed_sweep --preset=launch/configs/cartpole_dqn.cfg --seeds=5
  python -m launch.experiments.seed_sweep --preset=launch/configs/cartpole_dqn.cfg \
      --env=gymnax:CartPole-v1 --run_mode=anakin --seeds=16

Writes <out>/results.md, <out>/results.csv and <out>/curves.png.
"""

import os

from absl import app
from absl import flags

from launch.cli import parse_flags
from launch.experiments import common

flags.DEFINE_string("preset", "launch/configs/cartpole_dqn.cfg", "The flagfile to sweep.")
flags.DEFINE_string("env", "gymnasium:CartPole-v1", "Environment (overrides the preset's).")
flags.DEFINE_integer("seeds", 5, "Seeds first_seed .. first_seed + N - 1.")
flags.DEFINE_integer("first_seed", 0, "The first seed.")
common.define_run_flags("runs/seed_sweep")
FLAGS = flags.FLAGS


def main(argv):
  del argv
  name = os.path.splitext(os.path.basename(FLAGS.preset))[0]
  seeds = list(range(FLAGS.first_seed, FLAGS.first_seed + FLAGS.seeds))
  result = common.run_agent(name, FLAGS.preset, FLAGS.env, seeds, FLAGS.run_mode, FLAGS.out,
                            FLAGS.total_steps, FLAGS.eval_every, FLAGS.extra_flags)
  command = (f"`python -m launch.experiments.seed_sweep --preset={FLAGS.preset} --env={FLAGS.env} "
             f"--seeds={FLAGS.seeds} --run_mode={FLAGS.run_mode}`")
  print(common.write_table([result], FLAGS.out, command))
  print(f"plot: {common.plot([result], FLAGS.out, FLAGS.env)}")


if __name__ == "__main__":
  app.run(main, flags_parser=parse_flags)
