"""Evaluates a saved agent: `python -m launch.evaluate --checkpoint_dir=runs/cartpole_dqn/checkpoints --episodes=20`.

Reads the policy parameters and the run's config from a checkpoint (the
newest, or `--step`), rebuilds the network from the config, and runs
episodes with the greedy policy (or `--epsilon`). Prints one JSON line
with the mean and std of the return. Checkpoints of anakin runs hold one
set of parameters per seed: `--seed_index` picks one.
"""

from absl import app
from absl import flags

from launch.cli import checkpoint_tool_main, parse_flags

FLAGS = flags.FLAGS
flags.DEFINE_string("checkpoint_dir", None, "A run's checkpoint directory "
                    "(by default <logdir>/checkpoints).")
flags.DEFINE_integer("episodes", 10, "Episodes to run.")
flags.DEFINE_integer("step", None, "Checkpoint (env step) to load; default the newest.")
flags.DEFINE_float("epsilon", 0.0, "Exploration epsilon of the evaluated policy (0 is greedy).")
flags.DEFINE_string("env", None, "Environment to evaluate in; default the run's own.")
flags.DEFINE_integer("seed", 0, "Seed of the evaluation environment and policy.")
flags.DEFINE_integer("seed_index", 0, "Which seed's parameters, for anakin runs of "
                     "several seeds (0 is the run's --seed).")


class _FixedVariables:
  """A VariableSource that always serves the same parameters."""

  def __init__(self, params):
    self._params = params

  def get_variables(self, names=("policy",)):
    return [self._params for _ in names]


def evaluate_checkpoint(checkpoint_dir: str, episodes: int, step=None, epsilon: float = 0.0,
                        env_name=None, seed: int = 0, seed_index: int = 0) -> dict:
  """Returns {"eval_return_mean", "eval_return_std", "episodes", "step", ...}."""
  import jax
  import numpy as np

  from agents.dqn.config import ConfigError
  from agents.dqn.local_run import evaluate
  from agents.dqn.saved_policy import load_policy

  if episodes < 1:
    raise ConfigError(f"--episodes={episodes}: must be at least 1.")
  if not 0.0 <= epsilon <= 1.0:
    raise ConfigError(f"--epsilon={epsilon}: must lie in [0, 1].")
  policy = load_policy(checkpoint_dir, step, seed_index, env_name, eval_epsilon=epsilon,
                       env_seed=seed)
  params, builder, networks = policy["params"], policy["builder"], policy["networks"]
  step, env_name, num_seeds = policy["step"], policy["env"], policy["num_seeds"]
  environment = policy["environment"]
  actor = builder.make_actor(networks, _FixedVariables(params), jax.random.PRNGKey(seed),
                             evaluation=True)
  returns = evaluate(environment, actor, episodes)
  return {"checkpoint": policy["path"], "step": step, "env": env_name,
          "episodes": episodes, "epsilon": epsilon,
          "eval_return_mean": float(np.mean(returns)),
          "eval_return_std": float(np.std(returns)),
          "returns": [float(r) for r in returns],
          "run_mode": policy["meta"].get("run_mode"), "seed_index": seed_index if num_seeds > 1 else 0}


def main(argv):
  return checkpoint_tool_main(argv, lambda: evaluate_checkpoint(
      FLAGS.checkpoint_dir, FLAGS.episodes, FLAGS.step, FLAGS.epsilon, FLAGS.env, FLAGS.seed,
      FLAGS.seed_index))


if __name__ == "__main__":
  app.run(main, flags_parser=parse_flags)
