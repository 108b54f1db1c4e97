"""PQN's compiled trainer: act, step and learn from each rollout inside one program.

The same shape as `acme_jax_dqn.anakin` (an `Anakin` of pure functions,
one seed, vmapped over seeds by the caller), with a rollout where DQN has
replay: every iteration steps `num_envs` copies `rollout_len` times
(epsilon-greedy on the online params, auto-reset), then runs PQN's update
(`pqn.make_rollout_update`) on that rollout. Learning starts at the first
iteration, so no iteration needs a cond.
"""

import functools
from typing import Any, Callable, NamedTuple, Optional

import chex
import jax
import jax.numpy as jnp
import optax

from acme_jax_dqn import anakin
from acme_jax_dqn import anakin_loops
from acme_jax_dqn import learning
from acme_jax_dqn import pqn
from acme_jax_dqn.actors import PolicyFn
from acme_jax_dqn.envs.gymnax_adapter import GymnaxEnv
from acme_jax_dqn.networks import Networks
from acme_jax_dqn.types import TrainingState


class PQNState(NamedTuple):
  """One seed's training state: learner (no target params), environments and counters."""
  learner: TrainingState
  env_state: Any  # gymnax states, leaves [E, ...].
  observation: chex.Array  # [E, ...]
  episode_return: chex.Array  # [E]
  env_steps: chex.Array  # int32: env steps of this seed, all copies counted.
  key: chex.PRNGKey


def make_pqn_anakin(env: GymnaxEnv, networks: Networks, optimizer: optax.GradientTransformation,
                    rollout_update, policy: PolicyFn,
                    epsilon_fn: Callable[[chex.Array], chex.Array], *, num_envs: int,
                    rollout_len: int, eval_episodes: int,
                    eval_epsilon: float = 0.0, reward_clip: float = 0.0,
                    eval_policy: Optional[PolicyFn] = None) -> anakin.Anakin:
  """Builds PQN's compiled trainer.

  Args:
    env: the gymnax environment.
    networks, optimizer: the Q-network and its optimizer (no target network).
    rollout_update: `pqn.make_rollout_update(...)`: (state, rollout) -> (state, rollout, metrics).
    policy, epsilon_fn: acting, as in `anakin.make_anakin`.
    num_envs, rollout_len: a rollout is `rollout_len` steps of `num_envs` copies.
    eval_episodes, eval_epsilon, reward_clip, eval_policy: as in `anakin.make_anakin`.
  """
  eval_policy = eval_policy or policy

  def collect(state: PQNState, _):
    state, step, stats = anakin.step_copies(env, policy, epsilon_fn, state, reward_clip)
    rollout_step = pqn.RolloutStep(step.observation, step.action, step.reward,
                                   step.env_discount, step.end.astype(jnp.float32),
                                   step.next_observation, jnp.ones_like(step.reward))
    return state, (rollout_step, stats)

  def init(key):
    learner_key, env_key, key = jax.random.split(key, 3)
    observation, env_state = anakin.reset_copies(env, env_key, num_envs)
    return PQNState(
        learner=learning.init_training_state(networks, optimizer, learner_key,
                                             target_network=False),
        env_state=env_state, observation=observation,
        episode_return=jnp.zeros((num_envs,), jnp.float32),
        env_steps=jnp.zeros((), jnp.int32), key=key)

  def learn(state: PQNState, rollout: pqn.RolloutStep):
    learner_state, _, metrics = rollout_update(state.learner, rollout)
    return state._replace(learner=learner_state), metrics

  def iteration(state: PQNState, _, packed: bool = True):
    state, (rollout, stats) = anakin_loops.carry_scan(collect, state, None, rollout_len,
                                                      packed=packed)
    state, metrics = learn(state, rollout)
    return state, (jax.tree.map(jnp.sum, stats), metrics)

  def train_chunk(state: PQNState, first_iteration: chex.Array, num_iterations: int,
                  warmup: Optional[int] = None, unroll: int = 1, acting_apart: bool = False,
                  packed_carry: bool = True):
    # Every iteration learns, from a rollout that acts in a scan of its own before the update.
    del first_iteration, warmup, acting_apart
    state, (stats, sums) = anakin_loops.summed_scan(
        functools.partial(iteration, packed=packed_carry), state, num_iterations, unroll,
        packed_carry)
    return state, anakin.chunk_metrics(state, stats, sums, jnp.float32(num_iterations),
                                       epsilon_fn)

  def learner_step(learner_state, rollout):
    return rollout_update(learner_state, rollout)

  return anakin.Anakin(init=init, train_chunk=train_chunk,
                       evaluate=anakin.make_evaluate(env, eval_policy, eval_episodes,
                                                     eval_epsilon),
                       learn=learn, learner_step=learner_step, fill_steps=0,
                       env_steps_per_iteration=rollout_len,
                       learner_calls_per_iteration=1)  # One update (epochs x minibatches).
