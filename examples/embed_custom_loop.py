"""Embedding: a DQN agent from DQNBuilder + DQNConfig, driven by your own loop on your own dm_env.

  python examples/embed_custom_loop.py --steps=3000
"""

import dm_env
from absl import app, flags
import jax
import numpy as np
from dm_env import specs as dm_specs

from acme_jax_dqn import specs
from agents.dqn import DQNBuilder, DQNConfig

flags.DEFINE_integer("steps", 3000, "Env steps to train for.")
FLAGS = flags.FLAGS


class Corridor(dm_env.Environment):
  """Your environment: walk right along 8 cells to earn 1; episodes stop after 20 steps."""

  def __init__(self, size=8, limit=20):
    self.size, self._limit = size, limit

  def reset(self):
    self._pos, self._t = 0, 0
    return dm_env.restart(self._obs())

  def step(self, action):
    self._pos = int(np.clip(self._pos + (1 if action == 1 else -1), 0, self.size - 1))
    self._t += 1
    if self._pos == self.size - 1:
      return dm_env.termination(1.0, self._obs())
    if self._t >= self._limit:
      return dm_env.truncation(0.0, self._obs())
    return dm_env.transition(0.0, self._obs())

  def _obs(self):
    return np.eye(self.size, dtype=np.float32)[self._pos]

  def observation_spec(self):
    return dm_specs.Array((self.size,), np.float32)

  def action_spec(self):
    return dm_specs.DiscreteArray(2)


def main(argv):
  del argv
  env = Corridor()
  spec = specs.make_environment_spec(env)
  config = DQNConfig(hidden_sizes=(32,), batch_size=32, min_replay_size=200,
                     epsilon_decay_steps=FLAGS.steps // 2, target_update_period=50)
  builder = DQNBuilder(config)
  networks = builder.make_networks(spec)
  replay = builder.make_replay_buffer(spec)
  learner = builder.make_learner(networks, replay, jax.random.PRNGKey(0))
  actor = builder.make_actor(networks, learner, jax.random.PRNGKey(1),
                             adder=builder.make_adder(replay))
  timestep = env.reset()
  actor.observe_first(timestep)
  for _ in range(FLAGS.steps):  # Your loop: act, step, observe, learn.
    action = actor.select_action(timestep.observation)
    timestep = env.step(action)
    actor.observe(action, timestep)
    if replay.num_inserted >= config.min_replay_size:
      learner.step()
    actor.update()
    if timestep.last():
      timestep = env.reset()
      actor.observe_first(timestep)
  greedy = builder.make_actor(networks, learner, jax.random.PRNGKey(2), evaluation=True)
  timestep, steps = env.reset(), 0
  while not timestep.last():
    timestep, steps = env.step(greedy.select_action(timestep.observation)), steps + 1
  print(f"greedy episode: return {timestep.reward:.1f} in {steps} steps "
        f"(best: 1.0 in {env.size - 1}); learner loss {learner.metrics().get('loss'):.4f}")


if __name__ == "__main__":
  app.run(main)
