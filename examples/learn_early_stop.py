"""Trains DQN on CartPole with `acme_jax_dqn.learn` and stops at a mean greedy return of 475.

  python examples/learn_early_stop.py [--mode=anakin]

The config is cartpole_dqn.cfg's (launch/configs/) without its learning-rate decay.
"""

import os
import sys

from absl import app
from absl import flags
from absl import logging
import jax

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import acme_jax_dqn  # pylint: disable=wrong-import-position
from agents.dqn import DQNConfig  # pylint: disable=wrong-import-position

flags.DEFINE_enum("mode", "local", ["local", "anakin"], "Run mode (anakin uses gymnax's CartPole).")
flags.DEFINE_integer("seed", 0, "The run's seed.")
FLAGS = flags.FLAGS

CONFIG = DQNConfig(hidden_sizes=(128, 128), batch_size=128, num_sgd_steps_per_step=4,
                   samples_per_insert=128, target_update_period=1, target_update_tau=0.005,
                   epsilon_end=0.01, epsilon_decay_steps=5_000, huber_delta=0.0)


class StopAt(acme_jax_dqn.Callback):
  """Stops training once the mean greedy return reaches `target`."""

  def __init__(self, target: float):
    self.target = target

  def on_eval(self, row):
    print(f"env step {row['env_steps']}: eval return {row['eval_return_mean']:.1f}")
    return row["eval_return_mean"] >= self.target


def main(_):
  logging.set_verbosity(logging.WARNING)  # orbax logs every checkpoint save at INFO.
  env = "gymnax:CartPole-v1" if FLAGS.mode == "anakin" else "gymnasium:CartPole-v1"
  params, metrics = acme_jax_dqn.learn(env, CONFIG, 50_000, key=jax.random.PRNGKey(FLAGS.seed),
                                       mode=FLAGS.mode, callbacks=[StopAt(475.0)],
                                       eval_every=2_500, quiet=True)
  print(f"stopped early: {metrics['stopped_early']} at env step {metrics['env_steps']}, "
        f"eval return {metrics['eval_return_mean']:.1f}; "
        f"{sum(x.size for x in jax.tree.leaves(params))} parameters; logs in {metrics['logdir']}")


if __name__ == "__main__":
  app.run(main)
