"""Our actor and learner inside Acme's own EnvironmentLoop (dm-acme 0.4.0).

  pip install --no-deps dm-acme==0.4.0
  python examples/acme_environment_loop.py --steps=8000

On Python 3.11, dm-acme installs only with --no-deps, without dm-launchpad
(no wheel); `acme_interop.import_acme()` imports it all the same (see its
docstring). The agent is our LocalAgent:
Acme's loop calls its select_action / observe_first / observe / update,
and update runs our learner at the configured samples-per-insert ratio.
"""

from absl import app, flags
import jax
import numpy as np

from acme_jax_dqn import acme_interop, envs, specs
from agents.dqn import DQNConfig, LocalAgent

acme_interop.import_acme()
from acme import core  # pylint: disable=g-import-not-at-top,wrong-import-position
from acme import environment_loop  # pylint: disable=g-import-not-at-top,wrong-import-position
from acme.utils import loggers  # pylint: disable=g-import-not-at-top,wrong-import-position

flags.DEFINE_integer("steps", 8000, "Env steps to train for, counted by Acme's loop.")
flags.DEFINE_integer("eval_episodes", 5, "Greedy episodes after training.")
FLAGS = flags.FLAGS


def main(argv):
  del argv
  env = envs.make_environment("gymnasium:CartPole-v1", seed=0)
  config = DQNConfig(hidden_sizes=(64, 64), batch_size=64, num_sgd_steps_per_step=4,
                     samples_per_insert=64.0, min_replay_size=500, learning_rate=1e-3,
                     target_update_period=1, target_update_tau=0.01, epsilon_end=0.01,
                     epsilon_decay_steps=2000, huber_delta=0.0)
  agent = LocalAgent(specs.make_environment_spec(env), config, jax.random.PRNGKey(0))
  assert isinstance(agent, core.Actor) and isinstance(agent.learner, core.Learner)
  environment_loop.EnvironmentLoop(env, agent, logger=loggers.NoOpLogger()).run(
      num_steps=FLAGS.steps)
  greedy = agent.builder.make_actor(agent.networks, agent.learner, jax.random.PRNGKey(1),
                                    evaluation=True)
  evaluation = environment_loop.EnvironmentLoop(
      envs.make_environment("gymnasium:CartPole-v1", seed=100), greedy, should_update=False,
      logger=loggers.NoOpLogger())
  returns = [evaluation.run_episode()["episode_return"] for _ in range(FLAGS.eval_episodes)]
  print(f"acme EnvironmentLoop: {FLAGS.steps} steps, {agent.learner_steps} learner steps; "
        f"greedy return {np.mean(returns):.1f} over {len(returns)} episodes")


if __name__ == "__main__":
  app.run(main)
