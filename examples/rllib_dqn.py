"""RLlib's DQN on CartPole-v1 with the kit's JAX module and learner.

  pip install -e '.[rllib]'
  python examples/rllib_dqn.py [--max_steps=60000] [--num_env_runners=2]

RLlib's env runners, prioritized replay, n-step sampling and training loop
run as they are; the RLModule (acting) and the Learner (the loss, the
optimizer, the target update) are the kit's JAX ones. Stops once RLlib's
training return mean reaches 450.
"""

import os
import sys

from absl import app
from absl import flags

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from agents.rllib_dqn import JaxDQNConfig  # pylint: disable=wrong-import-position

flags.DEFINE_integer("max_steps", 60_000, "Env steps to train for at most.")
flags.DEFINE_integer("num_env_runners", 0, "RLlib env runners (0: sample in this process).")
FLAGS = flags.FLAGS


def main(_):
  import ray  # pylint: disable=import-outside-toplevel
  ray.init(include_dashboard=False, log_to_driver=False)
  config = (JaxDQNConfig()
            .environment("CartPole-v1")
            .env_runners(num_env_runners=FLAGS.num_env_runners)
            .training(lr=5e-4, train_batch_size_per_learner=32, n_step=3, double_q=True,
                      dueling=True, target_network_update_freq=500,
                      epsilon=[(0, 1.0), (10_000, 0.02)])
            .rl_module(model_config={"fcnet_hiddens": [256], "hiddens": [256]}))
  algo = config.build_algo()
  steps = 0
  while steps < FLAGS.max_steps:
    result = algo.train()
    runners = result["env_runners"]
    steps = runners["num_env_steps_sampled_lifetime"]
    learner = result["learners"]["default_policy"]
    print(f"env steps {steps}: return mean {runners.get('episode_return_mean', float('nan')):.1f}"
          f", qf_loss {learner.get('qf_loss', float('nan')):.3f}, "
          f"q_mean {learner.get('q_mean', float('nan')):.2f}")
    if runners.get("episode_return_mean", 0.0) >= 450:
      break
  print(f"checkpoint: {algo.save().checkpoint.path}")
  algo.stop()
  ray.shutdown()


if __name__ == "__main__":
  app.run(main)
